"""One Python value as TOML value text (bool, int, float, str, list, tuple, dict), for the TOML files
datakit and trainkit write (a LoaderConfig, tune's best.toml) and for `--set KEY=VALUE`. The stdlib
reads TOML (tomllib) but does not write it, and no chosen dependency does; this is the one writer."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def toml_value(v: Any) -> str:
    """`v` as TOML value text; a JSON string is a TOML basic string, so strings go through json.dumps."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else "nan" if math.isnan(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML value for {type(v).__name__}")

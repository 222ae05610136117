"""Field checks every training-config section runs in its `__post_init__` (trainkit/config/sections.py,
trainkit/config/data.py): a word among its `Literal` choices, a number in its range."""
from __future__ import annotations

import math
import typing
from typing import Any, Literal

from trainkit.errors import ConfigError


def check_choices(section: Any, prefix: str) -> None:
    """Refuse a word that is not one of its `Literal[...]` field's choices (also on direct construction)."""
    for name, tp in typing.get_type_hints(type(section)).items():
        value = getattr(section, name)
        if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
            raise ConfigError(f"{prefix}.{name}", f"{value!r} is not one of {', '.join(typing.get_args(tp))}")


def check_finite(key: str, value: float, *, low: float, high: float = math.inf, what: str) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(key, f"must be {what}, got {value}")

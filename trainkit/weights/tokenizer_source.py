"""Which prompt tokenizer a run trains with and where that choice came from: never a silent one.

    cfg = keep_tokenizer(cfg, fixed, out)              # init_from's tokenizer file, copied into output.dir
    source = tokenizer_source(cfg, model.cfg, fixed)   # {"name": ..., "from": ...} or None
    print(f"trainkit: {describe_tokenizer(source)}")   # the first line of the run's log; summary.json "tokenizer"

Prompts tokenized another way than a checkpoint was trained with give a model that is wrong and
looks fine, so the run says which tokenizer it took, in its first lines and in summary.json. The
choice itself is the family's (its config's `tokenizer` field; `model.init_from`'s folder is read by
its `Weights.config_from`, which names where it found one: pi05 `weights_tokenizer`, gr00t's
tokenizer.json); this module only reports it, for any family with a `tokenizer` field, and keeps a
tokenizer file taken from init_from's folder in output.dir (`keep_tokenizer`): a resume, an export
or a predict of the run never reads init_from's folder, which may have moved since.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from datakit.durable import write_atomic
from trainkit.config import RunConfig
from trainkit.models import Fixed

BUILTIN = "builtin"
KEPT = "tokenizer"  # output.dir/tokenizer/: the run's copy of init_from's tokenizer file


def keep_tokenizer(cfg: RunConfig, fixed: Fixed, out: Path) -> RunConfig:
    """`cfg` naming a copy in `out` of the tokenizer file model.init_from's folder gave (`fixed`),
    written atomically (every rank may write it: the same bytes); unchanged when the checkpoint gave
    none or a folder (gr00t's tokenizer.json folder is named where it is)."""
    if "tokenizer" not in fixed or not Path(fixed["tokenizer"][0]).is_file():
        return cfg
    src = Path(fixed["tokenizer"][0])
    kept = Path(out).resolve() / KEPT / src.name
    kept.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(kept, src.read_bytes())
    model = dataclasses.replace(cfg.model, overrides={**cfg.model.overrides, "tokenizer": str(kept)})
    return dataclasses.replace(cfg, model=model)


def tokenizer_source(cfg: RunConfig, model_cfg: Any, fixed: Fixed) -> dict[str, str] | None:
    """{"name": the tokenizer (a path, a word such as "tiny", or "builtin"), "from": where the run
    got it}; None for a family without a prompt tokenizer."""
    if not hasattr(model_cfg, "tokenizer"):
        return None
    name = str(model_cfg.tokenizer) or BUILTIN
    if "tokenizer" in fixed:
        where = fixed["tokenizer"][1]
    elif "tokenizer" in cfg.model.overrides:
        where = "model.tokenizer as set"
    elif model_cfg.tokenizer:
        where = f"the {cfg.model.preset} preset's"
    elif cfg.model.init_from:
        where = "model.init_from's folder carries none, and none is set"
    else:
        where = "none set"
    return {"name": name, "from": where}


def describe_tokenizer(source: dict[str, str]) -> str:
    """The run's line about its tokenizer."""
    own = (": trainkit's own stand-in, not the tokenizer of any real checkpoint; set model.tokenizer to "
           "train with another") if source["name"] == BUILTIN else ""
    return f"prompt tokenizer {source['name']} ({source['from']}){own}"

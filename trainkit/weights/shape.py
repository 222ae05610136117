"""The model's shape from `model.init_from`'s checkpoint: a fine-tune names the checkpoint, not its widths.

    cfg, fixed = with_weights_shape(cfg, run_dir)   # before the model is built (the trainer, inspect)

The family reads every config field the checkpoint fixes from its folder, without reading any
tensor's data (`Weights.config_from`; pi05: trainkit/models/pi05/weights.py `config_from_weights`):
widths, depths, heads, vocab, patch and image size, action channels from model.safetensors'
header, chunk and prompt length from config.json. LeRobot's config.json names Gemma variants
("gemma_2b"), not widths, so a tiny or custom checkpoint is described by its tensors alone.
Those values replace the preset's in `model.overrides`, which the run's trainkit.json records: a
resume, `trainkit export` and `trainkit predict` rebuild the same model from it.
The rule against the run's own settings: the checkpoint's shape wins over the preset's; a model
field the run sets itself (the TOML's `[model]` table, `--set model.X=...`, an overlay) that differs
is refused in one line naming both values and the checkpoint; one that agrees is accepted.
A resume builds the model its newest checkpoint recorded and does not read init_from, which may
have moved since (trainkit/weights/load.py: a resume never reads it).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainkit.checkpoint.manifest import DamagedCheckpoint, read_manifest
from trainkit.config import RunConfig
from trainkit.errors import CheckpointError, ConfigError, ModelConfigError, WeightsError
from trainkit.models import Fixed, build_config, family
from trainkit.weights.load import read_weights_folder

# sources of a field that the checkpoint itself states; any other source is an assumption, said so
_STATED = ("model.safetensors", "config.json")


def with_weights_shape(cfg: RunConfig, run_dir: Path | None = None) -> tuple[RunConfig, Fixed]:
    """`cfg` with every model field model.init_from's checkpoint fixes in `model.overrides`, and
    those fields with where each was read. Unchanged ({}) without init_from; when `run_dir` holds a
    checkpoint that recorded the same init_from (a resume), the model it recorded ({} too)."""
    if not cfg.model.init_from:
        return cfg, {}
    given = dict(cfg.model.overrides)
    recorded = _recorded_model(run_dir) if run_dir is not None else None
    if recorded is not None and recorded.get("init_from") == cfg.model.init_from:
        return _with_overrides(cfg, {**recorded.get("overrides", {}), **given}), {}
    folder = Path(cfg.model.init_from)
    fam = family(cfg.model.family)
    if fam.weights is None or fam.weights.config_from is None:
        raise CheckpointError(str(folder), f"model.init_from: family {fam.name!r} has no checkpoint mapping "
                              "(it trains from random weights only)")
    files = read_weights_folder(folder)
    try:
        fixed = fam.weights.config_from(files, build_config(fam.name, cfg.model.preset), given)
    except WeightsError as e:
        raise CheckpointError(str(folder / e.file), str(e)) from None
    for name, (value, where) in fixed.items():
        if name in given and _plain(given[name]) != _plain(value):
            raise ConfigError(f"model.{name}", f"{given[name]!r} contradicts model.init_from's checkpoint, whose {name} "
                              f"is {value!r} ({folder}/{where}); drop model.{name}: the shape comes from the checkpoint")
    overrides = {**given, **{k: v for k, (v, _) in fixed.items()}}
    try:  # the shape the checkpoint gives must make a model: else the line names the checkpoint
        build_config(fam.name, cfg.model.preset, overrides)
    except ModelConfigError as e:
        from_json = any(where.startswith("config.json") for _, where in fixed.values())
        raise CheckpointError(str(folder / "config.json" if from_json else folder),
                              f"model.init_from's checkpoint gives a shape no {fam.name} model has: {e} "
                              f"(read: {describe(fixed)})") from None
    return _with_overrides(cfg, overrides), fixed


def _plain(value: Any) -> Any:
    """A sequence as a tuple: `--set model.patch=[1, 2, 2]` agrees with a checkpoint's (1, 2, 2)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def describe(fixed: Fixed) -> str:
    """`field value` of each field, with the source of each one the checkpoint does not state
    itself (a head count taken from the preset: what was assumed, said)."""
    return ", ".join(f"{k} {v}" + ("" if where.startswith(_STATED) else f" ({where})")
                     for k, (v, where) in sorted(fixed.items()))


def _with_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, overrides=overrides))


def _recorded_model(run_dir: Path) -> dict[str, Any] | None:
    """The `model` table the newest readable checkpoint manifest under `run_dir` records (whether
    that checkpoint is intact is the resume's own check, trainkit/checkpoint/dcp.py)."""
    steps = sorted((int(p.name[5:]), p) for p in (Path(run_dir) / "checkpoints").glob("step-*")
                   if p.name[5:].isdigit() and p.is_dir())
    for _, path in reversed(steps):
        try:
            model = read_manifest(path).config.get("model")
        except DamagedCheckpoint:
            continue
        return model if isinstance(model, dict) else None
    return None

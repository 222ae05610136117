"""Model families of trainkit, built by name: `build_model("pi05", "full")`.

A family module exposes a config dataclass, `PRESETS` (name -> config factory) and a model class
with `BLOCK_LISTS` (names of its nn.ModuleList block lists, addressed by trainkit.parallel).
"""
from __future__ import annotations

import dataclasses

import torch.nn as nn

from trainkit.models.errors import ModelConfigError
from trainkit.models.pi05 import PRESETS as PI05_PRESETS
from trainkit.models.pi05 import Pi05

# family -> (model class, presets)
MODEL_FAMILIES: dict[str, tuple[type[nn.Module], dict]] = {"pi05": (Pi05, PI05_PRESETS)}


def build_config(family: str, preset: str, **overrides):
    """The config of `family`/`preset` with fields replaced by `overrides` (checked again)."""
    if family not in MODEL_FAMILIES:
        raise ModelConfigError(f"unknown model family {family!r}; known: {sorted(MODEL_FAMILIES)}")
    presets = MODEL_FAMILIES[family][1]
    if preset not in presets:
        raise ModelConfigError(f"unknown {family} preset {preset!r}; known: {sorted(presets)}")
    cfg = presets[preset]()
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ModelConfigError(f"unknown {family} config field(s) {unknown}")
    return dataclasses.replace(cfg, **overrides)


def build_model(family: str, preset: str, **overrides) -> nn.Module:
    """The model of `family` at `preset` shapes (plus overrides), built on the current default
    device (wrap in `with torch.device("meta"):` for a no-memory build)."""
    cfg = build_config(family, preset, **overrides)
    return MODEL_FAMILIES[family][0](cfg)

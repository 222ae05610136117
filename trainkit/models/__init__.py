"""The family registry: model families by name, and what is built from their records.

    fam = family("pi05")                                   # the record (trainkit/models/family.py)
    model = build_model("pi05", "full", {"lm_depth": 4})   # on the current default device

A family is one package ending in a `Family(...)` record, registered here (`register`): the
built-in ones below, and a test's or a user's own at run time. The trainer, `inspect` and the data
stream reach a family only through its record.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from trainkit.models.dreamzero import FAMILY as DREAMZERO
from trainkit.errors import ModelConfigError
from trainkit.models.family import (Activations, BatchAdapter, Family, Fixed, FrozenCache, MemoryCalibration,
                                   MemoryMeasurement, Sampler, WeightsFiles)
from trainkit.models.gr00t import FAMILY as GR00T
from trainkit.models.pi05 import FAMILY as PI05

__all__ = ["Activations", "BatchAdapter", "DEFAULT_FAMILY", "FAMILIES", "Family", "Fixed", "FrozenCache", "MemoryCalibration",
           "MemoryMeasurement", "Sampler", "WeightsFiles", "build_config", "build_model", "family",
           "register"]

FAMILIES: dict[str, Family] = {}


def register(fam: Family) -> Family:
    """Make `fam` reachable as `model.family = "<fam.name>"` (a second one of that name replaces it)."""
    FAMILIES[fam.name] = fam
    return fam


def family(name: str) -> Family:
    """The record of family `name`; ModelConfigError naming the known ones."""
    if name not in FAMILIES:
        raise ModelConfigError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def build_config(name: str, preset: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """The config of family `name` at `preset`, with fields replaced by `overrides` (`model.*` of
    the run config) and checked again by the config's own __post_init__."""
    fam = family(name)
    if preset not in fam.presets:
        raise ModelConfigError(f"unknown {name} preset {preset!r}; known: {sorted(fam.presets)}")
    cfg = fam.presets[preset]()
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cfg)})
    if unknown:
        raise ModelConfigError(f"model.{unknown[0]}: not a field of {type(cfg).__name__} "
                               f"(fields: {', '.join(f.name for f in dataclasses.fields(cfg))})")
    return dataclasses.replace(cfg, **overrides)


def build_model(name: str, preset: str, overrides: Mapping[str, Any] | None = None) -> nn.Module:
    """The model of family `name` at `preset` (plus overrides), its frozen block lists without
    gradients, built on the current default device (in `with torch.device("meta"):` it costs no
    memory)."""
    fam = family(name)
    model = fam.model(build_config(name, preset, overrides))
    for block_list in fam.frozen:
        getattr(model, block_list).requires_grad_(False)
    return model


register(PI05)
register(DREAMZERO)
register(GR00T)
DEFAULT_FAMILY = PI05.name  # the family of a config that names none (model.family)

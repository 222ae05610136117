"""What `trainkit predict` samples from: a run's newest intact checkpoint, or a checkpoint folder
of `model.safetensors` + `config.json`, with the normalisation statistics it was trained with.

- A run folder (`checkpoints/step-N/`): the model and its config come from the checkpoint, as
  `trainkit export` reads them (`load_run_model`: trained weights or their EMA); the manifest
  names the dataset it trained on (its checksums), so predict knows whether `--shards` is that
  dataset (then the run's validation holdout is the default episode set).
- A checkpoint folder (`trainkit export`, LeRobot's `save_pretrained`, openpi's converter): the
  family, preset and data settings come from `--config CONFIG.toml` (+ `--set`), since
  `config.json` names no trainkit preset; the weights are read through `model.init_from`'s
  mapping (trainkit/weights/load.py), which refuses a shape that differs with one line.

Statistics (`training_stats`): the actions are unnormalised with what the model trained with, not
with `--shards`' own: the run's dataset (by identity) or `model.init_from`'s files
(`data.norm_from = "checkpoint"`), a checkpoint folder's processor / norm_stats files. Only when
a checkpoint folder carries none are `--shards`' own used, said so.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from datakit.shards.index import ShardIndex, load_index
from trainkit.checkpoint.manifest import read_manifest
from trainkit.checkpoint.resume_rules import dataset_identity
from trainkit.config import RunConfig, SourceConfig, load_config
from trainkit.errors import CheckpointError, DataError, LaunchError
from trainkit.models import Family, build_model, family
from trainkit.weights.export import load_run_model
from trainkit.weights.load import CONFIG_NAME, WEIGHTS_NAME, load_weights
from trainkit.weights.norm_stats import LEROBOT_MODE, read_weights_stats, with_weights_stats


@dataclass
class Source:
    """A model to predict with and where it came from."""

    model: nn.Module  # on the CPU, float32, eval mode
    cfg: RunConfig  # the run's config (a run) or --config's (a checkpoint folder)
    fam: Family
    path: Path  # the checkpoint folder read
    step: int | None  # optimiser steps of a run's checkpoint; None for a checkpoint folder
    dataset: dict[str, Any] | None  # identity of the dataset the run trained on; None: unknown


def open_source(path: str | Path, *, weights: str = "model", config: str | None = None,
                overrides: list[str] = ()) -> Source:
    """The model of a run folder or a checkpoint folder (module docstring); one-line errors for
    anything else, for a folder without `--config`, or `--config` with a run."""
    path = Path(path)
    if (path / WEIGHTS_NAME).is_file():
        if config is None:
            raise LaunchError(f"{path}: a checkpoint folder needs --config CONFIG.toml (the family, preset and "
                              "data settings it was trained with, e.g. a preset of trainkit/configs/)")
        if weights != "model":
            raise LaunchError(f"--weights {weights}: a checkpoint folder holds one set of weights")
        cfg = load_config(config, list(overrides), required=False)
        _check_norm(path, cfg.data.norm)
        return _from_folder(path, cfg)
    if config is not None or overrides:
        raise LaunchError(f"--config/--set: {path} is a run folder, which carries its own config (trainkit.json)")
    if not path.is_dir():
        raise LaunchError(f"{path}: not a run folder (with checkpoints/) or a checkpoint folder ({WEIGHTS_NAME} + "
                          f"{CONFIG_NAME})")
    if not any((path / "checkpoints").glob("step-*")):
        raise CheckpointError(str(path / "checkpoints"), "no checkpoint to predict from (a run saves one every "
                              "output.checkpoint_every steps)")
    model, cfg, found = load_run_model(path, weights)
    manifest = read_manifest(found)
    return Source(model=model.eval(), cfg=cfg, fam=family(cfg.model.family), path=found, step=manifest.step,
                  dataset=manifest.dataset)


def _from_folder(folder: Path, cfg: RunConfig) -> Source:
    fam = family(cfg.model.family)
    with torch.device("meta"):
        model = build_model(fam.name, cfg.model.preset, cfg.model.overrides)
    model.to_empty(device="cpu")  # every parameter is then filled from the file (the plan checks it)
    load_weights(model, fam, folder, lambda line: print(f"trainkit: {line}", file=sys.stderr))
    return Source(model=model.eval(), cfg=cfg, fam=fam, path=folder, step=None, dataset=None)


def training_stats(source: Source, index: ShardIndex, shards: Path) -> tuple[ShardIndex, str]:
    """`index` (of `--shards`) with the state/action statistics the model trained with, and where
    they came from; DataError/CheckpointError when they are unknown or do not fit the dataset."""
    dcfg = source.cfg.data
    if source.step is None:  # a checkpoint folder
        try:
            read_weights_stats(source.path)
        except CheckpointError:
            print(f"trainkit: {source.path} carries no statistics; the actions are unnormalised with "
                  f"{shards}'s own", file=sys.stderr)
            return index, f"{shards} (the checkpoint carries none)"
        index, found = with_weights_stats(index, source.path, dcfg.norm)
        return index, str(found)
    if dcfg.norm_from == "checkpoint":
        index, found = with_weights_stats(index, source.cfg.model.init_from, dcfg.norm)
        return index, str(found)
    if same_dataset(source, shards):
        return index, f"{shards} (the run's dataset)"
    run_shards = Path(dcfg.shards)
    try:
        theirs = load_index(run_shards)
        known = dataset_identity(run_shards) == source.dataset
    except Exception:  # noqa: BLE001 - moved, deleted, remote or damaged: the statistics are unknown
        known = False
    if not known:
        raise DataError(str(shards), f"another dataset than the run's (their checksums.json differ), and the run's "
                        f"own data.shards {dcfg.shards} is not readable here (or no longer that dataset): the "
                        "statistics it trained with are unknown; predict on the run's dataset or make its folder "
                        "readable")
    for part, names in (("state", "state_names"), ("action", "action_names")):
        if len(getattr(theirs, names)) != len(getattr(index, names)):
            raise DataError(str(shards), f"{len(getattr(index, names))} {part} channels; the run trained on "
                            f"{len(getattr(theirs, names))} ({dcfg.shards})")
    stats = {**index.stats, "state": theirs.stats["state"], "action": theirs.stats["action"]}
    return dataclasses.replace(index, stats=stats), f"{dcfg.shards} (the run's dataset)"


def _check_norm(folder: Path, norm: str) -> None:
    """A checkpoint folder's config.json names the action normalisation it was trained with
    (LeRobot's `normalization_mapping`; trainkit export writes it): it must be --config's data.norm,
    or the unnormalised actions would be wrong without a word."""
    try:
        mapping = json.loads((folder / CONFIG_NAME).read_text()).get("normalization_mapping") or {}
    except (OSError, ValueError, AttributeError):
        return  # unreadable here: load_weights has already refused it, or it names nothing
    theirs = {v: k for k, v in LEROBOT_MODE.items()}.get(mapping.get("ACTION"))
    if theirs is not None and theirs != norm:
        raise CheckpointError(str(folder / CONFIG_NAME), f"normalization_mapping ACTION is {mapping['ACTION']} "
                              f"(data.norm = {theirs!r}), --config has data.norm = {norm!r}; --set data.norm={theirs}")


def same_dataset(source: Source, shards: Path) -> bool:
    """Whether `--shards` is the dataset the run trained on, or one of its mixture's (by checksums,
    not by path)."""
    return source.dataset is not None and _identity(shards) in (source.dataset, *source.dataset.get("sources", ()))


def mixture_source(source: Source, shards: Path) -> SourceConfig | None:
    """The [[data.sources]] table of a mixture's run whose dataset `shards` is (by checksums); None
    when it is none of them (or the run's dataset is unknown)."""
    identity = _identity(shards)
    ids = (source.dataset or {}).get("sources", ())
    return next((s for s, i in zip(source.cfg.data.sources, ids) if i == identity), None)


def _identity(shards: Path) -> dict[str, Any] | None:
    try:
        return dataset_identity(shards)
    except DataError:
        return None

"""`trainkit export RUN_DIR OUT --format lerobot|openpi`: a run's newest intact checkpoint as the
weights users serve with, `model.safetensors` + `config.json` in the family's checkpoint format
(trainkit/models/pi05/weights.py), loadable by LeRobot's `PI05Policy.from_pretrained` and by
`model.init_from` again.

    trainkit export runs/pi05 out/pi05_lerobot --format lerobot      # keys prefixed `model.`
    trainkit export runs/pi05 out/pi05_base --format openpi --dtype bfloat16   # pi05_base's format
    trainkit export runs/pi05 out/pi05_ema --format lerobot --weights ema      # the weight EMA

The model is rebuilt from the config the checkpoint holds (trainkit.json) on the CPU and only its
weights are read from the DCP folder (through checkpoint_reader.py: nothing in it can run code);
the Adam moments are not read. config.json names the robot's cameras and state/action sizes from
the run's dataset index when it is still there (else the model's slots and 32 channels, said so),
and the normalisation statistics the run trained with go beside it (trainkit/weights/norm_stats.py).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn

from trainkit.checkpoint.dcp import find_checkpoint
from trainkit.checkpoint.reader import METADATA_NAME, CheckedReader, TensorsOnlyPlanner, UnsafeCheckpoint, read_metadata
from trainkit.config import RunConfig, config_from_dict
from trainkit.errors import CheckpointError
from trainkit.models import build_model, family
from trainkit.errors import WeightsError
from trainkit.weights.norm_stats import LEROBOT_MODE, stats_files, with_checkpoint_stats
from trainkit.weights.load import write_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_run_model(run_dir: str | Path, weights: str = "model") -> tuple[nn.Module, RunConfig, Path]:
    """The model of the newest intact checkpoint of `run_dir` (on the CPU, float32), its run's
    config and the checkpoint folder. `weights = "ema"`: the trainable parameters from the
    checkpoint's weight EMA (`ema.<name>`, written when the run had train.ema_decay > 0)."""
    found = find_checkpoint(Path(run_dir))
    if found is None:
        raise CheckpointError(str(Path(run_dir) / "checkpoints"), "no checkpoint to export (set output.checkpoint_every)")
    cfg = config_from_dict(found.manifest.config)
    with torch.device("meta"):
        model = build_model(cfg.model.family, cfg.model.preset, cfg.model.overrides)
    model.to_empty(device="cpu")
    files = set(found.manifest.files)
    try:
        read_metadata(found.path, files)
    except UnsafeCheckpoint as e:
        raise CheckpointError(str(found.path / METADATA_NAME), f"refused: {e}; nothing from it was run") from None
    state = {"model": model.state_dict()}
    if weights == "ema":
        if not found.manifest.config.get("train", {}).get("ema_decay"):
            raise CheckpointError(str(found.path), "holds no weight EMA (the run had no train.ema_decay); "
                                  "export --weights model")
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        state["ema"] = {n: torch.empty_like(t) for n, t in state["model"].items() if n in trained}  # own storage
    dcp.load(state, storage_reader=CheckedReader(found.path, files), planner=TensorsOnlyPlanner())
    model.load_state_dict({**state["model"], **state.get("ema", {})})
    return model, cfg, found.path


def _dataset(cfg: RunConfig, max_slots: int) -> tuple[dict[str, Any], Any]:
    """The robot's cameras and state/action sizes, and the run's statistics, from the run's dataset
    index (or model.init_from's, for data.norm_from = "checkpoint") when readable; else (generic
    features, None), said so."""
    from datakit.shards.index import load_index

    try:
        index = load_index(Path(cfg.data.shards))
    except Exception as e:  # noqa: BLE001 - moved, deleted or remote: the weights still export
        print(f"trainkit: {cfg.data.shards}: dataset index unreadable ({type(e).__name__}); config.json names "
              f"{max_slots} generic cameras and 32 state/action channels, and no statistics are written",
              file=sys.stderr)
        return {"cameras": [f"observation.images.slot{i}" for i in range(max_slots)], "state_dim": 32,
                "action_dim": 32}, None
    if cfg.data.norm_from == "checkpoint":
        index, _ = with_checkpoint_stats(index, cfg.model.init_from, cfg.data.norm)
    cams = [c for c in cfg.data.slots if c] or list(index.cameras)
    features = {"cameras": cams, "state_dim": len(index.state_names), "action_dim": len(index.action_names)}
    return features, {k: index.stats[k] for k in ("state", "action")}


def export_run(run_dir: str | Path, out: str | Path, fmt: str, dtype: str = "float32", weights: str = "model") -> Path:
    """Write the export of `run_dir`'s newest checkpoint into `out` (its trained weights, or with
    `weights = "ema"` its weight EMA); returns the checkpoint exported."""
    model, cfg, path = load_run_model(run_dir, weights)
    fam = family(cfg.model.family)
    if fam.weights is None:
        raise CheckpointError(str(run_dir), f"family {fam.name!r} has no checkpoint mapping to export to")
    if fmt not in fam.weights.formats:
        raise CheckpointError(str(out), f"--format {fmt!r}: {fam.name} exports {', '.join(fam.weights.formats)}")
    try:
        tensors = fam.weights.export_tensors(model.cfg, model.state_dict(), fmt)
    except WeightsError as e:
        raise CheckpointError(str(path), str(e)) from None
    # one copy each: the fused tensors' parts are views, and safetensors refuses tensors sharing memory
    tensors = {k: v.to(DTYPES[dtype], copy=True) for k, v in tensors.items()}
    features, stats = _dataset(cfg, fam.max_slots(model.cfg))
    config = fam.weights.config_json(model.cfg, features)
    config["dtype"] = dtype
    mode = LEROBOT_MODE[cfg.data.norm]
    config["normalization_mapping"] = {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}
    write_weights(Path(out), tensors, config, stats_files(stats, fmt, cfg.data.norm) if stats else {},
                  metadata=fam.weights.metadata(model.cfg) if fam.weights.metadata else {})
    return path

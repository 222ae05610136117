"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimiser, scheduler, RNG, loader.

    save_checkpoint(run_dir, step, model, opt, sched, data_state, global_batch)   # every rank calls it
    step, data_state = load_checkpoint(latest_checkpoint(run_dir), model, opt, sched, global_batch)

Layout: `run_dir/checkpoints/step-000100/` is one DCP folder. Each rank writes its own shards of
the FSDP parameters and optimiser state (`get_state_dict` gives sharded DTensor state, so no rank
gathers the 3B-parameter model), plus small per-rank entries for its RNG states and its loader
position. The folder is written as `step-000100.tmp` and renamed by rank 0 after every rank has
finished (a barrier), so a crash mid-save never leaves a folder that looks complete; resume takes
the newest complete one. A resumed run gives the same losses as an unbroken one: weights,
Adam moments, the schedule, the torch RNGs and the sampler position are all restored, and the
flow noise is a function of the loader position (`data.flow_generator`).

Another world size (more or fewer nodes) resumes too, when the global batch is unchanged: DCP
reshards the model and optimiser state to the new FSDP layout, and the loader position is the
number of samples consumed, the same on every rank and independent of the split (see
`datakit/loader/sampler.py`), so every rank takes rank 0's and the job continues the same global
sample order. The RNG states are rank 0's too. Losses then differ from an unbroken run's in the
last bits (other reduction order) and in the flow noise, which is drawn per rank and micro-batch.
A different global batch is refused: the order and the optimiser's step size would change.
"""
from __future__ import annotations

import io
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainkit.errors import LaunchError

_STEP = re.compile(r"^step-(\d{6,})$")


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _blob(obj: Any) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
                    sched: torch.optim.lr_scheduler.LRScheduler, data_state: dict[str, int],
                    global_batch: int) -> Path:
    """Write the checkpoint after `step` optimiser steps (collective: every rank calls it);
    `global_batch` is the optimiser's, recorded so a resume on another world size can check it."""
    rank, _ = _rank_world()
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step-{step:06d}", root / f"step-{step:06d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, opt)
    _, world = _rank_world()
    state = {"model": model_sd, "optim": optim_sd, "sched": _blob(sched.state_dict()), "step": _blob(step),
             "world_size": _blob(world), "global_batch": _blob(global_batch),
             f"rank{rank}": _blob({"rng": _rng_state(), "data": data_state})}
    dcp.save(state, checkpoint_id=str(tmp))
    _barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    _barrier()
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder under `run_dir`, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and p.is_dir())
    return done[-1][1] if done else None


def load_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer,
                    sched: torch.optim.lr_scheduler.LRScheduler, global_batch: int) -> tuple[int, dict[str, int]]:
    """Restore everything from `path`; returns (steps done, this rank's loader state). A
    checkpoint of another world size is accepted when it records the same `global_batch`."""
    rank, world = _rank_world()
    saved_world = _unblob(_load_one(path, "world_size"))
    own = f"rank{rank}"
    if saved_world != world:
        saved_keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
        # checkpoints from before the key existed cannot show that the global batch is the same
        saved_batch = _unblob(_load_one(path, "global_batch")) if "global_batch" in saved_keys else None
        if saved_batch != global_batch:
            raise LaunchError(
                f"{path}: written by {saved_world} ranks with global batch {saved_batch or 'unknown'}, this run has "
                f"{world} ranks and global batch {global_batch}; a resume on another world size needs the same "
                "train.global_batch (or set output.resume=false / another output.dir)")
        own = "rank0"  # the loader position is global (samples consumed); rank 0's is every rank's
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "sched": io.BytesIO(), "step": io.BytesIO(), own: io.BytesIO()}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    sched.load_state_dict(_unblob(state["sched"]))
    mine = _unblob(state[own])
    torch.set_rng_state(mine["rng"]["cpu"])
    if "cuda" in mine["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(mine["rng"]["cuda"])
    return int(_unblob(state["step"])), mine["data"]


def _load_one(path: Path, key: str) -> io.BytesIO:
    """One small replicated entry of the checkpoint at `path`."""
    saved = {key: io.BytesIO()}
    dcp.load(saved, checkpoint_id=str(path))
    return saved[key]


def _unblob(buf: io.BytesIO) -> Any:
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # plain tensors, numbers, dicts: no code from a checkpoint folder

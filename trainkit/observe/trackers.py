"""Experiment tracking: the rows of metrics.jsonl, also sent to TensorBoard or Weights & Biases.

    [output]
    tracker = "tensorboard"   # <output.dir>/tensorboard/: tensorboard --logdir runs/pi05_tiny/tensorboard
    tracker = "wandb"         # <output.dir>/wandb/: offline unless WANDB_MODE says otherwise

Rank 0 sends every number of every row metrics.py writes (`"kind": "step"`, `"interval"`, `"eval"`),
under `<section>/<key>`: `train/loss`, `train/grad_norm`, `train/lr`, `train/data_wait_s`;
`perf/step_time_s`, `perf/samples_per_s_gpu`, `perf/mfu`, `perf/peak_mem_gib`, `perf/data_wait_frac`
...; `val/val_loss`, `val/val_loss_ema`. A figure the device cannot give (MFU on a CPU, memory off
CUDA) is null in metrics.jsonl and not sent. The x axis is optimiser steps done, metrics.jsonl's
0-based `"step"` + 1: the number in the terminal's step line and in the checkpoint names
(`step-000010` holds the weights after 10 steps). A resumed TensorBoard run purges the events past
its checkpoint (SummaryWriter's `purge_step`), so the steps retrained after a crash show once.

Both are optional extras (`pip install '.[tensorboard]'`, `'.[wandb]'`). `check_tracker` runs
before the model is built, so a missing package is one line naming the extra (exit 2) before any
training. wandb runs offline by default, so a run needs no account or network: `WANDB_MODE=online`
logs live, `wandb sync <output.dir>/wandb/offline-run-*` uploads an offline run later; the project
is `$WANDB_PROJECT` (default "trainkit"), the run's name output.dir's folder name, its config the
run's config.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Protocol

from trainkit.errors import ConfigError, OutputDirError

SECTIONS = {"step": "train", "interval": "perf", "eval": "val"}  # metrics.jsonl "kind" -> tracker section
NOT_SENT = ("kind", "step", "steps")  # the row's identity and its interval length, not a figure
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> the module (and pyproject extra) it needs
WANDB_INIT_SECONDS = 30  # wandb.init's wait for its service / server (wandb's default: 90)


class Tracker(Protocol):
    def log(self, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def check_tracker(name: str, out: Path | None = None) -> None:
    """Refuse a tracker whose package is not installed, naming the extra, or whose folder in
    output.dir (`out`) is a file (before any training)."""
    if name == "none":
        return
    if out is not None and (out / name).exists() and not (out / name).is_dir():
        raise OutputDirError(out / name, f"is a file; output.tracker = {name!r} writes its files in this folder")
    try:
        importlib.import_module(EXTRAS[name])
    except ImportError:
        raise ConfigError("output.tracker", f"{name!r} needs the {EXTRAS[name]} package, not installed here: "
                                            f"pip install '.[{name}]' (or pip install {EXTRAS[name]})") from None


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl row under their tracker names (None, bools and text left out)."""
    section = SECTIONS[row["kind"]]
    return {f"{section}/{k}": float(v) for k, v in row.items()
            if k not in NOT_SENT and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardTracker:
    """torch.utils.tensorboard's SummaryWriter in `<out>/tensorboard/`, flushed after every metrics flush."""

    def __init__(self, out: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # a resume at step k re-trains the steps after k: hide the events a crashed run left past it
        self._writer = SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    def log(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            for name, value in scalars(row).items():
                self._writer.add_scalar(name, value, global_step=row["step"] + 1)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A wandb run in `<out>/wandb/`, offline unless the user set WANDB_MODE."""

    def __init__(self, out: Path, config: dict[str, Any]):
        import wandb

        mode = os.environ.get("WANDB_MODE") or "offline"
        try:  # online without a network: wandb gives up after init_timeout, here one line
            self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "trainkit"), name=out.resolve().name,
                                   dir=str(out), config=config, mode=mode,
                                   settings=wandb.Settings(init_timeout=WANDB_INIT_SECONDS))
        except Exception as e:  # noqa: BLE001 - wandb's errors (CommError, UsageError, timeouts) share no base
            raise ConfigError("output.tracker", f"wandb could not start a run (WANDB_MODE={mode}: "
                                                f"{type(e).__name__}: {' '.join(str(e).split())[:200]}); unset "
                                                "WANDB_MODE to log offline without a network") from None

    def log(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._run.log(scalars(row), step=row["step"] + 1)

    def close(self) -> None:
        self._run.finish()


def open_tracker(name: str, out: Path, *, rank: int, start_step: int, config: dict[str, Any]) -> Tracker | None:
    """Rank 0's tracker for `output.tracker` (None for "none" and on every other rank)."""
    if name == "none" or rank != 0:
        return None
    check_tracker(name)
    return TensorBoardTracker(out, start_step) if name == "tensorboard" else WandbTracker(out, config)

"""Checkpoints: model and optimiser tensors with torch.distributed.checkpoint (DCP), everything
else in trainkit's manifest.

    save_checkpoint(run_dir, step, model, opt, sched, data_state, record, keep=3)   # every rank calls it
    found = find_checkpoint(run_dir)            # the newest intact one (and what was skipped), or None
    step, data_state = load_checkpoint(found, model, opt, sched, cfg.optim)

Layout: `run_dir/checkpoints/step-000100/` is one DCP folder plus `trainkit.json`. Each rank writes
its own shards of the FSDP parameters and Adam moments (`get_state_dict` gives sharded DTensor
state, so no rank gathers the 3B-parameter model); DCP holds tensors only. The small state (the
schedule, each rank's RNG states and loader position, step, world size, global batch, the run's
config and dataset identity) is JSON in the manifest, with the size and SHA-256 of every file
(manifest.py). The folder is written as `step-000100.tmp`, sealed with the manifest and
renamed by rank 0 after every rank has finished, so a crash mid-save never leaves a folder that
looks complete; then all but the newest `output.keep_checkpoints` are deleted (one that `trainkit
export` is reading is held, checkpoint/hold.py, and deleted by a later save). A save that cannot
write (a full disk, a quota, a read-only mount) is one CheckpointError on every rank naming the
folder and the errno (ENOSPC: torch.save reports a full disk as "unexpected pos 704 vs 598", the
OSError only as its context, so the chain is walked, and with a process group DCP's pickling
drops the context, so each rank's files are watched too: checkpoint/errno_writer.py); the temporary folder is removed and the
older checkpoints are left as they were, so a rerun resumes from the newest of them.

Resume takes the newest intact checkpoint: a folder without a manifest, or whose files do not
match it (truncated, zeroed, flipped, deleted), is skipped, and the caller says which and why; when
none is intact the run refuses in one line. Nothing in a checkpoint folder can run code: see
reader.py (a restricted unpickler for DCP's metadata, no bytes entries). What a resume
may change is trainkit/checkpoint/resume_rules.py. A resumed run gives the same losses as an unbroken one:
weights, Adam moments, the schedule, the torch RNGs and the sampler position are all restored,
and the flow noise is a function of the loader position (`data.flow_generator`).

Another world size (more or fewer nodes) resumes too, when the global batch is unchanged: DCP
reshards the model and optimiser state to the new FSDP layout, and the loader position is the
number of samples consumed, the same on every rank and independent of the split (see
`datakit/loader/sampler.py`), so every rank takes rank 0's and the job continues the same global
sample order. The RNG states are rank 0's too. Losses then differ from an unbroken run's in the
last bits (other reduction order) and in the flow noise, which is drawn per rank and micro-batch.
"""
from __future__ import annotations

import errno
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from datakit.durable import fsync_dir
from trainkit.checkpoint.errno_writer import ErrnoWriter
from trainkit.checkpoint.manifest import (DamagedCheckpoint, Manifest, check_files, read_manifest, rng_state, seal,
                                          set_rng_state)
from trainkit.checkpoint.hold import hold_checkpoint, remove_unless_held
from trainkit.checkpoint.reader import METADATA_NAME, CheckedReader, TensorsOnlyPlanner, UnsafeCheckpoint, read_metadata
from trainkit.config import OptimConfig
from trainkit.errors import CheckpointError
from trainkit.optim.optimizer import apply_config
from trainkit.parallel.ranks import all_gather, barrier, broadcast, rank_world
from trainkit.checkpoint.resume_rules import START_OVER, RunRecord

_STEP = re.compile(r"^step-(\d{6,})$")
_TMP = re.compile(r"^step-(\d{6,})\.tmp$")


@dataclass
class Found:
    """The checkpoint a resume uses, and the newer ones it skipped ("step-000004: why")."""

    path: Path
    manifest: Manifest
    skipped: list[str] = field(default_factory=list)

    @property
    def record(self) -> RunRecord:
        m = self.manifest
        return RunRecord(config=m.config, dataset=m.dataset, global_batch=m.global_batch)

    def skip_lines(self, doing: str) -> list[str]:
        """One line per newer checkpoint passed over, as a resume (`doing` = "resuming from") and an
        export ("exporting") say it: never a silent fall-back to older weights."""
        return [f"skipping checkpoint {self.path.parent}/{why}; {doing} {self.path.name}" for why in self.skipped]


def _tensor_state(model: nn.Module, opt: torch.optim.Optimizer,
                  extra: dict[str, dict[str, torch.Tensor]] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """DCP's share of the state (tensors only: weights, Adam state and the `extra` trees, e.g. the
    weight EMA), and the optimiser's param groups as they are now (they are rebuilt from the config
    on resume, never read back)."""
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd["state"], **(extra or {})}
    stray = [k for k, v in _leaves(state) if not isinstance(v, torch.Tensor)]
    if stray:  # DCP would write it as a pickled bytes entry, which reader.py refuses to read
        raise TypeError(f"checkpoint state {stray[0]} is not a tensor")
    return state, optim_sd["param_groups"]


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in tree.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
                    sched: torch.optim.lr_scheduler.LRScheduler, data_state: dict[str, int], record: RunRecord,
                    keep: int = 0, extra: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """Write the checkpoint after `step` optimiser steps (collective: every rank calls it), then
    keep only the newest `keep` (0: all). `extra`: more named tensor trees for DCP ({"ema": ...})."""
    rank, world = rank_world()
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step-{step:06d}", root / f"step-{step:06d}.tmp"
    state, _ = _tensor_state(model, opt, extra)
    why = None
    if rank == 0:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as e:
            why = _write_problem(e)
    why = broadcast(why)  # also the barrier: no rank writes before the folder is there
    if why is None:
        writer = None
        try:
            with _one_process_quietly():
                writer = ErrnoWriter(str(tmp))  # the OSErrors of this rank's files (DCP's pickling loses them)
                dcp.save(state, storage_writer=writer)  # DCP raises on every rank when one rank fails
            manifest = Manifest(step=step, world_size=world, global_batch=record.global_batch,
                                dataset=record.dataset, config=record.config, sched=sched.state_dict(), ranks=[])
            seal(tmp, manifest, {"rng": rng_state(), "data": data_state})
            if rank == 0:
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
                fsync_dir(root)
        except (OSError, CheckpointException) as e:
            why = _write_problem(e, writer.errors if writer is not None else [])
        whys = [w for w in all_gather(why) if w is not None]  # rank 0's manifest and rename too
        why = next((w for w in whys if _ERRNO_TEXT.match(w)), whys[0] if whys else None)  # the rank that saw the errno
    if why is not None:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # frees what it took; the older checkpoints stay
        raise CheckpointError(str(final), f"not written ({why}); older checkpoints are untouched and a rerun "
                                          f"resumes from the newest of them")
    if rank == 0:
        _rotate(root, keep, step)
    barrier()
    return final


@contextmanager
def _one_process_quietly() -> Iterator[None]:
    """Without a process group (parallel.fsdp="none") DCP warns at every save and load that it
    assumes one process: it is so by design, and the warning would be the run's only stderr line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


_ERRNO_TEXT = re.compile(r"^E[A-Z0-9]+: ")  # what _write_problem says when it found an errno


def _write_problem(e: BaseException, seen: list[OSError] = ()) -> str:
    """What stopped a save, in a few words: the errno of the first OSError in the chain ("ENOSPC:
    No space left on device") or among those this rank's files raised (`seen`: ErrnoWriter's),
    else the underlying error's first line."""
    for x in [*_chain(e), *seen]:
        if isinstance(x, OSError) and x.errno:
            return f"{errno.errorcode.get(x.errno, x.errno)}: {x.strerror}"
    return _cause(e)


def _chain(e: BaseException) -> list[BaseException]:
    """`e`, each rank's failure DCP wrapped in it (`failures`: rank -> (exception, stack)), and
    every exception these were raised from or during, in that order."""
    out: list[BaseException] = []
    todo = [e]
    while todo and len(out) < 50:
        x = todo.pop(0)
        if not isinstance(x, BaseException) or any(x is y for y in out):
            continue
        out.append(x)
        failures = getattr(x, "failures", None)
        inner = [f[0] if isinstance(f, tuple) else getattr(f, "exception", f)
                 for f in (failures.values() if isinstance(failures, dict) else ())]
        todo += [*inner, x.__cause__, x.__context__]
    return out


def _rotate(root: Path, keep: int, step: int) -> None:
    """Delete all but the newest `keep` checkpoints up to `step` (one just written), and temporary
    folders of earlier crashed saves (the run lock means no other save is under way). Later steps
    are left alone: a damaged one this run skipped, or another run's (output.resume=false). So is
    one an export is reading (checkpoint/hold.py): a later rotation deletes it."""
    done = [p for p in _step_folders(root) if int(_STEP.match(p.name).group(1)) <= step]
    for p in done[keep:] if keep else []:
        remove_unless_held(p)
    for p in root.iterdir():
        if _TMP.match(p.name):
            shutil.rmtree(p, ignore_errors=True)


def _step_folders(root: Path) -> list[Path]:
    """Every `step-N` folder under `root`, newest first."""
    if not root.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(steps, reverse=True)]


def _manifest_or_why(path: Path) -> Manifest | str:
    try:
        return read_manifest(path)
    except DamagedCheckpoint as e:
        return str(e)


def find_checkpoint(run_dir: Path, hold: ExitStack | None = None) -> Found | None:
    """The newest checkpoint under `run_dir` whose files match its manifest (collective); None if
    there is none at all, CheckpointError if there are some and none is intact. `hold` (a reader
    outside the run, one process): each folder is held before it is checked and the one returned
    stays held on that stack, so the run's rotation cannot delete it while it is read; a folder
    the rotation deleted after the listing is passed over unnamed (gone, not damaged)."""
    root = Path(run_dir) / "checkpoints"
    rank, _ = rank_world()
    skipped: list[str] = []
    for path in broadcast(_step_folders(root) if rank == 0 else None):
        with ExitStack() as this:
            if hold is not None and this.enter_context(hold_checkpoint(path)) and not path.is_dir():
                continue
            manifest = broadcast(_manifest_or_why(path) if rank == 0 else None)
            try:
                if isinstance(manifest, str):
                    raise DamagedCheckpoint(manifest)
                check_files(path, manifest)
            except DamagedCheckpoint as e:
                skipped.append(f"{path.name}: {e}")
                continue
            if hold is not None:
                hold.enter_context(this.pop_all())
            return Found(path, manifest, skipped)
    if skipped:
        raise CheckpointError(str(root), f"no intact checkpoint ({'; '.join(skipped)}); {START_OVER}")
    return None


def load_checkpoint(found: Found, model: nn.Module, opt: torch.optim.Optimizer,
                    sched: torch.optim.lr_scheduler.LambdaLR, optim_cfg: OptimConfig,
                    extra: dict[str, dict[str, torch.Tensor]] | None = None) -> tuple[int, dict[str, int]]:
    """Restore model, optimiser, schedule and RNGs from `found` (collective); returns (steps done,
    this rank's loader state). The optimiser's hyperparameters come from `optim_cfg`; the tensors
    of `extra` (trees the checkpoint was saved with) are loaded in place."""
    rank, world = rank_world()
    m, files = found.manifest, set(found.manifest.files)
    try:  # before DCP touches the folder: a planted metadata is refused, never unpickled as it is
        read_metadata(found.path, files)
    except UnsafeCheckpoint as e:
        raise CheckpointError(str(found.path / METADATA_NAME), f"refused: {e}; nothing from it was run (planted, "
                              f"or not written by trainkit): move the folder away, or {START_OVER}") from None
    state, param_groups = _tensor_state(model, opt, extra)
    try:
        with _one_process_quietly():
            dcp.load(state, storage_reader=CheckedReader(found.path, files), planner=TensorsOnlyPlanner())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's failure (a BaseException)
        raise CheckpointError(str(found.path),
                              f"cannot be loaded into this model ({_cause(e)}); {START_OVER}") from None
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict={"state": state["optim"], "param_groups": param_groups})
    sched.load_state_dict(m.sched)
    apply_config(opt, sched, optim_cfg)
    # another world size: the loader position is global and rank 0's RNG states are every rank's
    own = m.ranks[rank] if m.world_size == world else m.ranks[0]
    try:
        set_rng_state(own["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(str(found.path), f"trainkit.json holds no usable RNG state ({e})") from None
    return m.step, own["data"]


def _cause(e: BaseException) -> str:
    """The first line of the underlying error of a DCP failure (DCP wraps each rank's as `failures`)."""
    chain = _chain(e)
    e = chain[1] if len(chain) > 1 and getattr(e, "failures", None) else e
    first = next((x for x in str(e).splitlines() if x.strip()), "")
    return f"{type(e).__name__}: {first[:300]}"

"""The Ray engine (`datakit convert SRC OUT --engine ray [--ray-address ADDR]`): one Ray task
per planned shard, so a conversion runs on the cores of a cluster instead of one machine.

It reuses everything the local engine does and changes only who runs a shard:
- the plan (convert/plan.py): the same shard boundaries, so the same bytes as `--engine local`;
- the shard commit (convert/shard.py): a task writes its shard under a temporary name in a folder of
  its own attempt (OUT/.datakit-staging/tasks/<attempt>/), fsyncs it, renames it straight to
  OUT/shard-N.tar, then writes its journal. A retried attempt, or an orphan of a killed driver
  still running on the cluster, never writes into another attempt's file; the bytes are the
  same whoever renames last;
- resume: the driver learns which shards are committed from OUT's journals (before it starts
  any task), never from its own memory, so a driver killed mid-run and started again resumes;
- below the shard (convert/split.py): when the cluster has more task slots than there are shards, one
  task per episode writes a part file and one join task per shard (which Ray starts once its
  episodes are done) appends them in plan order;
- the index: convert() assembles it from the journals and writes it last, on the driver.

A task whose worker dies (killed, out of memory, node lost) is retried by Ray up to
MAX_RETRIES times; an error raised by the task itself (a bad episode under --on-error fail,
a full disk) is not retried, and stops the run like the local engine does. Progress is one bar
on the driver, fed by task completions (ray.wait).

No address: a local Ray instance with --workers CPUs is started for this run and shut down
after it. With an address (or RAY_ADDRESS), the driver joins that cluster: datakit must be
installed on every node, and SRC and OUT must be paths every node sees (a shared filesystem).
The address is checked first (`ray_address.py`: a dead, stalled or wrong one fails within
20 s naming it). If the caller already initialised Ray, that session is used as it is.
SIGTERM keeps the caller's handler (ray.init replaces it with one exiting 15): the CLI stops
the tasks, keeps the committed shards and exits 143, as with the local engine.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import torch

from datakit.convert.config import ConvertConfig
from datakit.progress import Progress
from datakit.convert.engines.engine import Job
from datakit.convert.fault_hooks import kill_markers, kill_once
from datakit.convert.journal import Journal
from datakit.convert.engines.ray_address import check_ray_address
from datakit.convert.shard import OutputShard, commit_shard, write_shard
from datakit.convert.split import EpisodePart, join_parts, new_scratch, scratch_root, split_below_shard, write_part
from datakit.errors import DatakitError
from datakit.sources.episode import DatasetSpec, EpisodeRef

MAX_RETRIES = 3  # Ray re-runs a task whose worker died this many times
CANCEL_WAIT_S = 30.0  # after an error: how long cancelled tasks get to remove their files


def import_ray() -> Any:
    """The `ray` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise DatakitError("--engine ray needs Ray: pip install 'robodata[ray]' (or: pip install ray)") from None
    return ray


# ---- the tasks (run in Ray worker processes) ------------------------------------------------

def _commit_from(out: Path, shard: OutputShard, j: Journal) -> None:
    """Commit a shard written in an attempt's folder: the rename lands it in OUT itself."""
    shard.path = Path(out) / shard.path.name
    commit_shard(out, shard, j)


def shard_task(spec: DatasetSpec, cfg: ConvertConfig, out: Path, index: int, refs: list[EpisodeRef],
               kill_marker: str | None = None) -> Journal:
    """One shard, written and committed: a Ray task."""
    torch.set_num_threads(1)  # parallelism is across tasks; one core each
    scratch = new_scratch(out, f"shard-{index:06d}")
    try:
        j, shard = write_shard(spec, cfg, scratch, index, refs, lambda n: kill_once(kill_marker))
        _commit_from(out, shard, j)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return j


def episode_task(spec: DatasetSpec, cfg: ConvertConfig, out: Path, index: int, ref: EpisodeRef,
                 kill_marker: str | None = None) -> EpisodePart:
    """One episode of shard `index` into a part file of its own: a Ray task."""
    torch.set_num_threads(1)
    part = write_part(spec, cfg, new_scratch(out, f"ep-{ref.episode_index:06d}"), index, ref)
    kill_once(kill_marker)  # after the part is written, before it is reported
    return part


def join_task(cfg: ConvertConfig, out: Path, index: int, refs: list[EpisodeRef], kill_marker: str | None,
              *parts: EpisodePart) -> Journal:
    """Shard `index` from its episodes' parts, in plan order, committed: a Ray task. The parts
    stay (a retried join needs them); the driver removes them once the shard is committed."""
    scratch = new_scratch(out, f"join-{index:06d}")
    try:
        j, shard = join_parts(cfg, scratch, index, refs, parts, delete=False)
        kill_once(kill_marker)
        _commit_from(out, shard, j)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return j


# ---- the driver ------------------------------------------------------------------------------

def connect(ray: Any, cfg: ConvertConfig) -> bool:
    """Join the cluster at cfg.ray_address (or RAY_ADDRESS), or start a local Ray with
    --workers CPUs; returns True if this call started the session (the caller shuts it down)."""
    if ray.is_initialized():
        return False
    address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
    quiet = dict(logging_level=logging.WARNING, configure_logging=True)
    main_thread = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        if address:
            check_ray_address(address)  # ray.init would wait for a dead GCS without a deadline
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=cfg.workers, include_dashboard=False, **quiet)
    except ConnectionError as e:
        raise DatakitError(f"--ray-address {address}: cannot join the Ray cluster ({e})") from None
    if on_sigterm is not None:  # ray.init's handler exits 15 with a C++ dump: keep the caller's (exit 143)
        signal.signal(signal.SIGTERM, on_sigterm)
    return True


def check_fits(ray: Any, cfg: ConvertConfig) -> None:
    """A task asking more CPUs or memory than any node has would wait forever: say so now.
    (An autoscaling cluster that would add such a node later is refused too: start one first.)"""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    cpus = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    memory = max((n.get("memory", 0.0) for n in nodes), default=0.0)
    if cfg.ray_cpus_per_task > cpus:
        raise DatakitError(f"ray_cpus_per_task = {cfg.ray_cpus_per_task:g}, but no Ray node has more than "
                           f"{cpus:g} CPUs")
    if cfg.ray_memory_per_task and cfg.ray_memory_per_task > memory:
        raise DatakitError(f"ray_memory_per_task = {cfg.ray_memory_per_task} bytes, but no Ray node has more than "
                           f"{int(memory)} bytes for tasks")


def _task_slots(ray: Any, cfg: ConvertConfig) -> int:
    """How many tasks the cluster runs at once."""
    cpus = ray.cluster_resources().get("CPU", 1.0)
    return max(1, int(cpus / cfg.ray_cpus_per_task))


def _failure(ray: Any, e: BaseException, out: Path, what: str) -> BaseException:
    """A task's own error as raised in the task; a Ray failure (worker died MAX_RETRIES + 1
    times, node lost, out of memory) as one line naming the shard."""
    cause = getattr(e, "cause", None)
    if isinstance(e, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        return cause
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return DatakitError(f"{out}: Ray task for {what} failed ({type(e).__name__}: {first}); "
                        f"rerun the same command to resume")


def run_shards_ray(spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[Job], bar: Progress) -> list[Journal]:
    """Convert and commit the shards of `jobs` as Ray tasks (the engine switch of convert()).
    Stops at the first error; the shards committed before it stay, for a rerun."""
    if not jobs:
        return []
    ray = import_ray()
    started = connect(ray, cfg)
    try:
        return _run(ray, spec, cfg, Path(out), jobs, bar)
    finally:
        if started:
            ray.shutdown()


def _run(ray: Any, spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[Job], bar: Progress) -> list[Journal]:
    opts: dict[str, Any] = dict(num_cpus=cfg.ray_cpus_per_task, max_retries=MAX_RETRIES, retry_exceptions=False)
    if cfg.ray_memory_per_task:
        opts["memory"] = cfg.ray_memory_per_task
    kill = kill_markers()
    check_fits(ray, cfg)
    spec_ref = ray.put(spec)  # once in the object store, not once per task
    split = split_below_shard(_task_slots(ray, cfg), jobs)
    # ObjectRef -> (what, shard index, frames it completes)
    pending: dict[Any, tuple[str, int, int]] = {}
    if split:
        episode_fn, join_fn = ray.remote(episode_task).options(**opts), ray.remote(join_task).options(**opts)
        for i, refs in jobs:
            eps = [episode_fn.remote(spec_ref, cfg, out, i, ref, kill.get("episode")) for ref in refs]
            pending.update({r: ("episode", i, ref.length) for r, ref in zip(eps, refs)})
            pending[join_fn.remote(cfg, out, i, refs, kill.get("join"), *eps)] = ("shard", i, 0)
    else:
        shard_fn = ray.remote(shard_task).options(**opts)
        for i, refs in jobs:
            task_ref = shard_fn.remote(spec_ref, cfg, out, i, refs, kill.get("shard"))
            pending[task_ref] = ("shard", i, sum(r.length for r in refs))
    done: list[Journal] = []
    parts: dict[int, list[Path]] = {}  # shard -> its episodes' attempt folders, removed once it is committed
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for r in ready:
                what, i, frames = pending.pop(r)
                try:
                    value = ray.get(r)
                except Exception as e:
                    task = f"shard {i}" if what == "shard" else f"an episode of shard {i}"
                    raise _failure(ray, e, out, task) from None
                if what == "episode":
                    if value.path is not None:
                        parts.setdefault(i, []).append(value.path.parent)
                else:
                    done.append(value)
                    for folder in parts.pop(i, []):
                        shutil.rmtree(folder, ignore_errors=True)
                if frames:
                    bar.update(frames)
    except BaseException:
        _cancel(ray, list(pending))
        shutil.rmtree(scratch_root(out), ignore_errors=True)
        raise
    shutil.rmtree(scratch_root(out), ignore_errors=True)
    return done


def _cancel(ray: Any, refs: list) -> None:
    """Stop the tasks still queued or running: KeyboardInterrupt inside a running task makes it
    remove its unfinished shard; then wait (a while) for them to wind down."""
    for r in refs:
        try:
            ray.cancel(r)
        except Exception:
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)

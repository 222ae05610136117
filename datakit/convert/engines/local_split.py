"""The local engine below the shard: when the plan has fewer shards than --workers, a process
pool converts episodes into part files (convert/split.py) while this process joins them into their
shards in plan order, hashing as it copies, and commits each shard on a background thread.
Part files go to tmpfs (/dev/shm) when it has room: they are read once and deleted, and need
never reach a disk (in OUT, writeback may write them to disk besides the shard).

Same stopping rules as the shard pool in local.py (and the same helpers, engine.py): the first error (a bad episode under
--on-error fail, an output error, a dead worker) stops the run, every worker is stopped
(SIGTERM, then SIGKILL) and waited for, the shards committed before it stay for a rerun, the
unfinished files are removed.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Iterator

import torch

from datakit.convert.config import ConvertConfig
from datakit.progress import Progress
from datakit.convert.engines.engine import Job, die_with_parent, stop_workers
from datakit.convert.journal import Journal
from datakit.machine import start_method
from datakit.convert.plan import predicted_bytes
from datakit.convert.shard import commit_shard
from datakit.convert.split import EpisodePart, join_parts, new_scratch, shm_scratch, write_part
from datakit.durable import discard
from datakit.errors import DatakitError
from datakit.shards.names import SHARD_TMP_GLOB
from datakit.sources.episode import DatasetSpec, EpisodeRef

_WORKER: dict = {}


def _init_worker(spec: DatasetSpec, cfg: ConvertConfig, scratch: Path, frames, parent: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)  # parallelism is across episodes; one core per worker
    _WORKER.update(spec=spec, cfg=cfg, scratch=scratch, frames=frames)


def _part_task(task: int, shard: int, ref: EpisodeRef) -> EpisodePart:
    frames = _WORKER["frames"]  # shared with the parent: the progress bar, per frame

    def progress(n: int) -> None:
        frames[task] += n

    return write_part(_WORKER["spec"], _WORKER["cfg"], _WORKER["scratch"], shard, ref, progress)


def run_split(spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[Job], bar: Progress) -> list[Journal]:
    """Convert and commit the shards of `jobs`, their episodes spread over a process pool. At
    most `workers + 2` episodes are ahead of the joiner, which bounds the part files in flight."""
    episodes = [(i, ref) for i, refs in jobs for ref in refs]
    nworkers = min(cfg.workers, len(episodes))
    window = nworkers + 2
    need = window * max(predicted_bytes(spec, cfg, ref) for _, ref in episodes)
    scratch = shm_scratch(out, need) or new_scratch(out, "local")
    ctx = mp.get_context(start_method())
    frames = ctx.Array("q", len(episodes), lock=False)  # per episode: frames converted so far
    before = {p.pid for p in mp.active_children()}
    pool = ProcessPoolExecutor(nworkers, mp_context=ctx, initializer=_init_worker,
                               initargs=(spec, cfg, scratch, frames, os.getpid()))
    futures: dict[tuple[int, int], Future] = {}
    done: list[Journal] = []
    workers: set[int] = set()  # our pool's worker pids, the only processes we ever signal

    def top_up(joined: int) -> None:
        """Submit, in plan order, until `window` episodes are ahead of the joiner (the pool runs
        them first come, first served)."""
        while len(futures) < min(joined + window, len(episodes)):
            i, ref = episodes[len(futures)]
            futures[i, ref.episode_index] = pool.submit(_part_task, len(futures), i, ref)
        workers.update({p.pid for p in mp.active_children()} - before)

    joined = 0

    def parts(i: int, refs: list[EpisodeRef]) -> Iterator[EpisodePart]:
        nonlocal joined
        for ref in refs:
            top_up(joined)
            f = futures[i, ref.episode_index]
            while not wait([f], timeout=0.2).done:
                bar.update(sum(frames) - bar.n)
            bar.update(sum(frames) - bar.n)
            try:
                part = f.result()
            except BrokenProcessPool:
                raise DatakitError(f"{out}: a worker process died (killed, or out of memory?) while converting "
                                   f"the episodes of shard {i} (episodes {refs[0].episode_index}-"
                                   f"{refs[-1].episode_index}); rerun the same command to resume") from None
            joined += 1
            yield part

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="shard-close") as closer:  # fsync overlaps joining
            commits = []
            for i, refs in jobs:
                if any(c.done() and c.exception() for c in commits):
                    break
                j, shard = join_parts(cfg, out, i, refs, parts(i, refs))
                commits.append(closer.submit(commit_shard, out, shard, j))
                done.append(j)
        for c in commits:
            if c.exception() is not None:
                raise c.exception()
        pool.shutdown(wait=True)
    except BaseException:
        stop_workers(pool, workers)  # returns once no worker runs: none writes a part after this
        for tmp in Path(out).glob(SHARD_TMP_GLOB):
            discard(tmp)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return done

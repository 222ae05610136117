"""The local engine: convert the planned shards in this process or in a process pool.

One shard is one task. A shard's commit (fsync, rename, journal) runs on a background thread
while the same process decodes the next shard, so fsync overlaps decoding.

Nothing here can hang on a dead worker: the pool is a `concurrent.futures.ProcessPoolExecutor`,
which notices a worker that died (kill -9, the OOM killer) and fails every pending task with
BrokenProcessPool within moments; the run then stops, naming the shards in flight. Workers
talk to the parent through a small shared-memory board (no queue, no lock a dying worker could
hold): per task, the worker's pid while it runs, the frames done (for the progress bar), and the
errno of a failed background commit. Workers ignore SIGINT and die on SIGTERM: the parent alone
decides, stops the busy workers with SIGTERM and removes their unfinished `.tmp` files.
"""
from __future__ import annotations

import errno
import multiprocessing as mp
import os
import signal
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from datakit.convert.config import ConvertConfig
from datakit.progress import Progress
from datakit.machine import start_method
from datakit.convert.engines.engine import Job, die_with_parent, stop_workers
from datakit.convert.journal import Journal
from datakit.convert.engines.local_split import run_split
from datakit.convert.shard import commit_shard, write_shard
from datakit.convert.split import split_below_shard
from datakit.durable import discard
from datakit.errors import DatakitError, OutputError
from datakit.shards.names import SHARD_PATTERN, SHARD_TMP_GLOB
from datakit.sources.episode import DatasetSpec, EpisodeRef



class Board:
    """Per-task shared counters, written by the one worker running the task, read by the parent."""

    def __init__(self, ctx, n: int):
        self.pid = ctx.Array("q", n, lock=False)  # worker pid while the task runs, else 0
        self.frames = ctx.Array("q", n, lock=False)  # frames converted so far
        self.commit_errno = ctx.Array("q", n, lock=False)  # errno of a failed commit (-1: no errno)

    def frames_done(self) -> int:
        return sum(self.frames)

    def busy(self) -> list[tuple[int, int]]:
        """(task, pid) of the tasks running now."""
        return [(k, p) for k, p in enumerate(self.pid) if p]


_WORKER: dict = {}


def _init_worker(spec: DatasetSpec, cfg: ConvertConfig, out: Path, board: Board, parent: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # how the parent stops a busy worker
    torch.set_num_threads(1)  # parallelism is across shards; one core per worker
    closer = ThreadPoolExecutor(1, thread_name_prefix="shard-close")
    # A worker's exit runs multiprocessing finalizers: pending commits finish before it ends,
    # so the executor's shutdown in the parent also waits for them.
    mp.util.Finalize(closer, closer.shutdown, kwargs={"wait": True}, exitpriority=100)
    _WORKER.update(spec=spec, cfg=cfg, out=out, board=board, closer=closer)


def _commit_in_worker(task: int, out: Path, shard, j: Journal) -> None:
    try:
        commit_shard(out, shard, j)
    except BaseException as e:
        cause = e.__cause__ if isinstance(e.__cause__, OSError) else e
        _WORKER["board"].commit_errno[task] = getattr(cause, "errno", None) or -1
        raise


def _run_task(task: int, index: int, refs: list[EpisodeRef]) -> Journal:
    w, board = _WORKER, _WORKER["board"]
    board.pid[task] = os.getpid()
    board.frames[task] = 0

    def progress(n: int) -> None:
        board.frames[task] += n

    try:
        j, shard = write_shard(w["spec"], w["cfg"], w["out"], index, refs, progress)
        w["closer"].submit(_commit_in_worker, task, w["out"], shard, j)
        return j
    finally:
        board.pid[task] = 0


def run_shards(spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[Job], bar: Progress) -> list[Journal]:
    """Convert and commit the shards of `jobs`, in this process (one worker) or in a process
    pool. Stops at the first error (a bad episode under --on-error fail, any output error, a
    dead worker); the shards committed before it stay, for a rerun."""
    if split_below_shard(cfg.workers, jobs):  # fewer shards than workers: episodes in parallel
        return run_split(spec, cfg, out, jobs, bar)
    if cfg.workers == 1 or len(jobs) <= 1:
        return _run_here(spec, cfg, out, jobs, bar)
    return _run_pool(spec, cfg, out, jobs, bar)


def _run_here(spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[Job], bar: Progress) -> list[Journal]:
    torch.set_num_threads(1)
    done: list[Journal] = []
    commits: list[Future] = []
    with ThreadPoolExecutor(1, thread_name_prefix="shard-close") as closer:  # fsync overlaps decoding
        for i, refs in jobs:
            if any(f.done() and f.exception() for f in commits):
                break  # a commit failed (disk full?): stop, and raise it below
            j, shard = write_shard(spec, cfg, out, i, refs, bar.update)
            commits.append(closer.submit(commit_shard, out, shard, j))
            done.append(j)
    # leaving the `with` waited for every commit; shards already committed stay, for a rerun
    for f in commits:
        if f.exception() is not None:
            raise f.exception()
    return done


def _describe(jobs: list[Job], tasks: list[int]) -> str:
    return ", ".join(f"shard {jobs[k][0]} (episodes {jobs[k][1][0].episode_index}-{jobs[k][1][-1].episode_index})"
                     for k in tasks)


def _run_pool(spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[Job], bar: Progress) -> list[Journal]:
    ctx = mp.get_context(start_method())
    board = Board(ctx, len(jobs))
    workers: set[int] = set()
    pool = ProcessPoolExecutor(min(cfg.workers, len(jobs)), mp_context=ctx, initializer=_init_worker,
                               initargs=(spec, cfg, out, board, os.getpid()))
    done: list[Journal] = []
    try:
        before = {c.pid for c in mp.active_children()}
        pending = {pool.submit(_run_task, k, i, refs) for k, (i, refs) in enumerate(jobs)}
        workers = {c.pid for c in mp.active_children()} - before  # all started by the submits
        while pending:
            busy = board.busy()  # before the wait: who was running when a worker died
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            bar.update(board.frames_done() - bar.n)
            if (failed := _commit_failure(out, jobs, board)) is not None:
                raise failed
            for f in finished:
                try:
                    done.append(f.result())
                except BrokenProcessPool:
                    tasks = sorted({k for k, _ in busy} | {k for k, _ in board.busy()})
                    raise DatakitError(
                        f"{out}: a worker process died (killed, or out of memory?) while converting "
                        f"{_describe(jobs, tasks) or 'a shard'}; rerun the same command to resume") from None
        pool.shutdown(wait=True)  # the workers' exit waits for their pending commits
    except BaseException:
        stop_workers(pool, workers)
        for tmp in Path(out).glob(SHARD_TMP_GLOB):
            discard(tmp)
        raise
    if (failed := _commit_failure(out, jobs, board)) is not None:  # the last commits, at the workers' exit
        raise failed
    return done


def _commit_failure(out: Path, jobs: list[Job], board: Board) -> OutputError | None:
    """The error of the first background commit that failed in a worker, if any."""
    failed = [k for k, e in enumerate(board.commit_errno) if e]
    if not failed:
        return None
    e = board.commit_errno[failed[0]]
    why = f"{errno.errorcode.get(e, e)}: {os.strerror(e)}" if e > 0 else "not an OS error"
    return OutputError(Path(out) / SHARD_PATTERN.format(index=jobs[failed[0]][0]),
                       f"cannot commit output ({why}); rerun the same command to resume")

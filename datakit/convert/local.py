"""The local engine: convert the planned shards in this process or in a process pool."""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

from datakit.config import ConvertConfig
from datakit.convert.journal import Journal
from datakit.convert.shard import check_committed, convert_shard
from datakit.errors import DatakitError
from datakit.sources.episode import DatasetSpec, EpisodeRef

_WORKER: dict = {}


def _init_worker(spec: DatasetSpec, cfg: ConvertConfig, out: Path, progress_q) -> None:
    torch.set_num_threads(1)  # parallelism is across shards; one core per worker
    closer = ThreadPoolExecutor(1, thread_name_prefix="shard-close")
    # A pool worker's exit runs multiprocessing finalizers: pending closes finish before it ends,
    # so pool.join() in the parent also waits for them.
    mp.util.Finalize(closer, closer.shutdown, kwargs={"wait": True}, exitpriority=100)
    _WORKER.update(spec=spec, cfg=cfg, out=out, q=progress_q, closer=closer)


def _run_shard(job: tuple[int, list[EpisodeRef]]) -> Journal | str:
    w = _WORKER
    return convert_shard(w["spec"], w["cfg"], w["out"], job[0], job[1], w["q"].put, w["closer"])


def run_shards(spec: DatasetSpec, cfg: ConvertConfig, out: Path, jobs: list[tuple[int, list[EpisodeRef]]],
               bar: tqdm) -> list[Journal]:
    """Convert shards in this process (one worker) or in a process pool; stops at the first
    error under --on-error fail (raised as DatakitError, unfinished .tmp files removed)."""
    if cfg.workers == 1 or len(jobs) <= 1:
        torch.set_num_threads(1)
        done: list[Journal] = []
        error = None
        with ThreadPoolExecutor(1, thread_name_prefix="shard-close") as closer:  # fsync overlaps decoding
            for i, refs in jobs:
                j = convert_shard(spec, cfg, out, i, refs, bar.update, closer)
                if isinstance(j, str):
                    error = j
                    break
                done.append(j)
        # leaving the `with` waited for every close; shards already closed stay, for a rerun
        if error is not None:
            raise DatakitError(error)
        check_committed(out, done)
        return done
    # fork starts workers in milliseconds (spawn re-imports torch and FFmpeg: ~2.5 s here). It is
    # safe here: the parent has run no torch op (no OpenMP pool) and no decoder, and pyarrow
    # resets its thread pool in a forked child. DATAKIT_MP_START overrides.
    method = os.environ.get("DATAKIT_MP_START", "fork" if "fork" in mp.get_all_start_methods() else "spawn")
    ctx = mp.get_context(method)
    q = ctx.Queue()
    done: list[Journal] = []
    pool = ctx.Pool(min(cfg.workers, len(jobs)), initializer=_init_worker, initargs=(spec, cfg, out, q))
    try:
        pending = [pool.apply_async(_run_shard, (job,)) for job in jobs]
        while pending:
            try:
                bar.update(q.get(timeout=0.2))
            except queue.Empty:
                pass
            for r in [r for r in pending if r.ready()]:
                pending.remove(r)
                j = r.get()
                if isinstance(j, str):
                    raise DatakitError(j)
                done.append(j)
        pool.close()
        pool.join()  # the workers' exit waits for their pending shard closes
        while True:  # the last progress messages
            try:
                bar.update(q.get_nowait())
            except queue.Empty:
                break
    except BaseException:
        pool.terminate()
        pool.join()
        for tmp in out.glob("shard-*.tar.tmp"):
            tmp.unlink(missing_ok=True)
        raise
    check_committed(out, done)
    return done

"""Who runs the feature shards: this process, a pool of local workers (one GPU each where there
are GPUs), or Ray (one task per shard). The work unit and its commit are `encode/shard.py`'s, so
every engine writes the same bytes; the driver learns what is done from the journals alone.

A job is (shard number, clips) or (shard number, prompts). Encoders load once per local worker
(the VAE is ~0.5 GB, umT5-XXL ~11 GB), once per Ray task. Local workers are spawned (CUDA cannot
be forked), die with the parent (`die_with_parent`) and are stopped by it on any error
(`stop_workers`), so none writes into OUT beside a rerun.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import torch

from datakit.convert.engines.engine import die_with_parent, stop_workers
from datakit.convert.engines.ray import _failure, connect, import_ray
from datakit.durable import discard
from datakit.encode.clips import Clip
from datakit.encode.config import EncodeConfig
from datakit.encode.journal import FeatureJournal
from datakit.encode.models import Encoders
from datakit.encode.shard import ClipSource, encode_clips, encode_prompts
from datakit.errors import DatakitError
from datakit.progress import Progress
from datakit.reader import open_shards
from datakit.shards.names import SHARD_TMP_GLOB


@dataclass
class Job:
    index: int  # feature shard number
    clips: list[Clip]  # a clip shard's clips (empty for the text shard)
    prompts: list[str]  # the text shard's prompts (empty for a clip shard)

    @property
    def size(self) -> int:
        return len(self.clips) + len(self.prompts)


def device_for(cfg: EncodeConfig, worker: int) -> str:
    """`cuda:<worker mod GPUs>` where there are GPUs (unless --device cpu), else cpu."""
    if cfg.device == "cpu" or (cfg.device is None and not torch.cuda.is_available()):
        return "cpu"
    return f"cuda:{worker % max(1, torch.cuda.device_count())}"


class Worker:
    """One process's encoders and source reader."""

    def __init__(self, src: Path, cfg: EncodeConfig, cameras: tuple[str, ...], device: str):
        if device == "cpu":  # one thread everywhere: CPU matmul sums in another order on 2 threads than on 1
            torch.set_num_threads(1)  # (umT5's outputs differed), and the bytes must not depend on the engine
        self.cfg, self.device, self.src = cfg, device, ClipSource.open(open_shards(src), cameras, cfg, device)
        self._clips: Encoders | None = None  # VAE (+ CLIP): loaded at the first clip job
        self._text: Encoders | None = None  # umT5: loaded at the text job only

    def run(self, out: Path, job: Job, progress: Callable[[int], None] = lambda n: None) -> FeatureJournal:
        cfg = self.cfg
        if job.prompts:
            if self._text is None:
                self._text = Encoders(None, cfg.text_encoder, None, cfg.dtype, self.device, cfg.text_len)
            return encode_prompts(self._text, out, job.index, job.prompts, progress)
        if self._clips is None:
            self._clips = Encoders(cfg.vae, None, cfg.image_encoder, cfg.dtype, self.device)
        return encode_clips(self._clips, self.src, cfg, out, job.index, job.clips, progress)


def run_here(src: Path, cfg: EncodeConfig, cameras: tuple[str, ...], out: Path, jobs: list[Job],
             bar: Progress) -> list[FeatureJournal]:
    if not jobs:
        return []
    w = Worker(src, cfg, cameras, device_for(cfg, 0))
    # the bar counts clips: a prompt shard's progress is not a clip's
    return [w.run(out, job, bar.update if job.clips else lambda n: None) for job in jobs]


_W: dict = {}


def _init(src: Path, cfg: EncodeConfig, cameras: tuple[str, ...], counter, parent: int) -> None:
    die_with_parent(parent)
    with counter.get_lock():
        rank = counter.value
        counter.value += 1
    _W["w"] = Worker(src, cfg, cameras, device_for(cfg, rank))


def _task(out: Path, job: Job) -> FeatureJournal:
    return _W["w"].run(out, job)


def run_pool(src: Path, cfg: EncodeConfig, cameras: tuple[str, ...], out: Path, jobs: list[Job],
             bar: Progress) -> list[FeatureJournal]:
    """`cfg.workers` spawned processes, one job at a time each; stops at the first error."""
    if cfg.workers == 1 or len(jobs) <= 1:
        return run_here(src, cfg, cameras, out, jobs, bar)
    ctx = mp.get_context("spawn")
    counter = ctx.Value("i", 0)
    pool = ProcessPoolExecutor(min(cfg.workers, len(jobs)), mp_context=ctx, initializer=_init,
                               initargs=(src, cfg, cameras, counter, os.getpid()))
    before = {c.pid for c in mp.active_children()}
    done: list[FeatureJournal] = []
    try:
        pending = {pool.submit(_task, out, job): job for job in jobs}
        workers = {c.pid for c in mp.active_children()} - before
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                job = pending.pop(f)
                try:
                    done.append(f.result())
                except BrokenProcessPool:
                    raise DatakitError(f"{out}: an encode worker died (killed, or out of memory?) while encoding "
                                       f"shard {job.index}; rerun the same command to resume") from None
                bar.update(len(job.clips))
        pool.shutdown(wait=True)
    except BaseException:
        stop_workers(pool, workers | ({c.pid for c in mp.active_children()} - before))
        for tmp in Path(out).glob(SHARD_TMP_GLOB):
            discard(tmp)
        raise
    return done


def _ray_task(src: Path, cfg: EncodeConfig, cameras: tuple[str, ...], out: Path, job: Job) -> FeatureJournal:
    return Worker(src, cfg, cameras, device_for(cfg, 0)).run(out, job)


def run_ray(src: Path, cfg: EncodeConfig, cameras: tuple[str, ...], out: Path, jobs: list[Job],
            bar: Progress) -> list[FeatureJournal]:
    """One Ray task per shard (a GPU each where the cluster has GPUs); stops at the first error."""
    if not jobs:
        return []
    ray = import_ray()
    started = connect(ray, cfg)
    try:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 and cfg.device != "cpu" else 0
        fn = ray.remote(_ray_task).options(num_gpus=gpus, max_retries=3)
        pending = {fn.remote(src, cfg, cameras, out, job): job for job in jobs}
        done = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            try:
                done.append(ray.get(ready[0]))
            except Exception as e:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise _failure(ray, e, out, f"shard {job.index}") from None
            bar.update(len(job.clips))
        return done
    finally:
        if started:
            ray.shutdown()

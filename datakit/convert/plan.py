"""The shard plan: which episodes go into which shard, from the source metadata alone, and how
many local workers convert them.

Every engine (the local process pool, Ray) starts from this plan: it depends only on the
scanned source and the options, so any worker, on any machine, run again after a crash, gives
the same shard boundaries and the same bytes. The worker count never changes the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datakit.convert.config import ConvertConfig
from datakit.machine import available_cpus
from datakit.shards.writer import BLOCK, npy_header
from datakit.sources.episode import DatasetSpec, EpisodeRef
from datakit.stages.colour import stored_shape


def _member_bytes(payload: int) -> int:
    """A tar member: one header block plus the payload padded to whole blocks."""
    return BLOCK + -(-payload // BLOCK) * BLOCK


def predicted_bytes(spec: DatasetSpec, cfg: ConvertConfig, ref: EpisodeRef) -> int:
    """Bytes an episode will take in a shard, from metadata alone (json assumed < 512 bytes)."""
    per_frame = 0
    for cam, cs in spec.cameras.items():
        if cs.storage == "image" or ref.videos.get(cam) is not None:
            h, w = cfg.size or (cs.height, cs.width)
            shape = stored_shape(cfg.layout, h, w)
            per_frame += _member_bytes(len(npy_header(shape, np.dtype(np.uint8))) + int(np.prod(shape)))
    for dim in (len(spec.state_names), len(spec.action_names)):
        per_frame += _member_bytes(len(npy_header((dim,), np.dtype(np.float32))) + 4 * dim)
    per_frame += _member_bytes(1)  # json
    return ref.length * per_frame


def plan_shards(spec: DatasetSpec, cfg: ConvertConfig) -> list[list[EpisodeRef]]:
    """Consecutive episodes per shard; a shard ends after the episode that reaches --shard-size."""
    plan: list[list[EpisodeRef]] = [[]]
    size = 0
    for ref in spec.episodes:
        plan[-1].append(ref)
        size += predicted_bytes(spec, cfg, ref)
        if size >= cfg.shard_size:
            plan.append([])
            size = 0
    return [p for p in plan if p]


# Share of the cores that per-camera decode threads keep busy in one worker (decoding releases the
# GIL; the frame loop, status detection and tar writing do not): --workers 1 on 2 cores ran at
# CPU/wall 1.77 on 2 real cameras (bench/results/convert.md).
THREAD_EFFICIENCY = 0.88


@dataclass(frozen=True)
class WorkerPlan:
    """How many worker processes convert the planned shards, and why (for the summary)."""

    workers: int
    why: str
    clamped_from: int | None = None  # the --workers asked for, when it was more than the cores


def _pool_span(work: list[int], workers: int) -> int:
    """The busiest worker's work when a pool hands out shards in plan order to whichever worker
    is free first (what ProcessPoolExecutor does)."""
    loads = [0] * workers
    for w in work:
        loads[loads.index(min(loads))] += w
    return max(loads)


def plan_workers(cfg: ConvertConfig, plan: list[list[EpisodeRef]], cores: int | None = None,
                 cameras: int = 1) -> WorkerPlan:
    """--workers as given, at most the usable cores. By default, from the plan's work (frames x
    cameras per shard) and the cores:
    - a pool of one worker per shard, when there are at least as many shards as cores and the
      busiest worker's share beats what camera threads alone would do;
    - else one worker, when its cameras' decode threads fill the cores: no process pool and no
      part files (the below-shard split writes every byte twice: on 2 cores, 480x640 H.264, one
      shard of 8 episodes of 2 cameras, it ran at 0.67-0.74x of one worker, issue 27);
    - else one worker per episode, up to the cores (the below-shard split), or per shard where
      each shard is one episode.
    More processes than cores only share them (--workers 8 on 2 cores ran at 0.6x)."""
    cores = cores or available_cpus()
    shards, episodes = len(plan), sum(len(refs) for refs in plan)
    if cfg.workers is not None:
        if cfg.workers > cores:
            return WorkerPlan(cores, f"--workers {cfg.workers}, clamped to the {cores} usable cores", cfg.workers)
        return WorkerPlan(cfg.workers, f"--workers {cfg.workers}")
    head = f"default: {shards} shard(s) of {episodes} episode(s), {cameras} camera(s) on {cores} usable cores"
    work = [sum(r.length for r in refs) * max(1, cameras) for refs in plan]
    threads = min(cores, max(1, cameras))
    one = sum(work) / (threads * THREAD_EFFICIENCY if threads > 1 else 1)
    if shards >= cores and _pool_span(work, cores) < one:
        return WorkerPlan(cores, f"{head}: one worker per shard up to the cores")
    if threads >= cores or shards == 0:
        return WorkerPlan(1, f"{head}: one worker, each camera decoded on its own thread")
    units, what = (shards, "shard") if shards >= cores or episodes == shards else (episodes, "episode")
    return WorkerPlan(min(cores, units), f"{head}: one worker per {what} up to the cores")

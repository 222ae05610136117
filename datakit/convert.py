"""`datakit convert SRC OUT`: episodes -> verified uint8 frame shards + global index.

Flow: scan the source -> plan shards (consecutive episodes, closed after the episode whose
predicted bytes reach --shard-size; the plan depends only on the source metadata and the
options) -> each shard is written by one worker, episode after episode, straight into
`shard-N.tar.tmp` (hashed on the fly, fsynced, renamed, then journaled) -> after every shard is
closed, frames.arrow, then index.json. A rerun after a crash or kill -9 keeps the journaled
shards that still hash right and redoes the others: the same bytes as an unbroken run, with any
number of workers.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from datakit.config import ConvertConfig
from datakit.episode_convert import EpisodeResult, convert_episode
from datakit.errors import DatakitError, OutputError
from datakit.shards.index import (
    CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME, SHARD_PATTERN, CameraEntry, EpisodeEntry, ShardEntry,
    ShardIndex, frames_schema, load_index, is_finished, member_schema, write_atomic, write_index,
)
from datakit.shards.stats import vector_stats
from datakit.durable import file_sha256
from datakit.shards.writer import BLOCK, ShardFile, npy_header
from datakit.sources import scan
from datakit.sources.episode import DatasetSpec, EpisodeRef
from datakit.stages.colour import stored_shape
from datakit.stages.slots import dataset_slot

STAGING = ".datakit-staging"
OPTIONS_NAME = "options.json"
JOURNAL = "shard-{index:06d}.journal"


@dataclass
class Placed:
    """An episode written into a shard at byte offset `base`."""

    result: EpisodeResult
    shard: int
    base: int


@dataclass
class Journal:
    """A closed shard: written to the staging folder after the shard is fsynced and renamed."""

    index: int
    planned: list[int]  # episode indices the plan gave this shard
    name: str
    bytes: int
    sha256: str
    placed: list[Placed]
    skipped: list[EpisodeResult]
    decoders: dict[str, int] = field(default_factory=dict)


@dataclass
class ConvertSummary:
    index: ShardIndex
    seconds: float
    resumed_shards: int = 0
    already_complete: bool = False
    decoders: dict[str, int] = field(default_factory=dict)  # backend -> camera-episodes decoded


# ---- plan ----------------------------------------------------------------------------------

def _member_bytes(payload: int) -> int:
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


# ---- output folder -------------------------------------------------------------------------

def _is_ours(name: str) -> bool:
    stem = name.split(".", 1)[0] if name.endswith(".tmp") else None  # index.json.<pid>.tmp, frames.arrow.tmp
    return name in (STAGING, MANIFEST_NAME, FRAMES_NAME, CHECKSUMS_NAME) or stem in ("index", "frames", "checksums") or (
        name.startswith("shard-") and (name.endswith(".tar") or name.endswith(".tar.tmp"))
    )


def prepare_output(out: Path, options: dict) -> bool:
    """Check OUT is empty, ours with the same options, or absent; returns True if already complete."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    others = sorted(n for n in os.listdir(out) if not _is_ours(n))
    if others:
        raise OutputError(f"{out}: output folder holds other files ({', '.join(others[:3])}); use an empty or new folder")
    if is_finished(out):
        try:
            idx = load_index(out)
        except Exception as e:
            raise OutputError(f"{out / MANIFEST_NAME}: unreadable index ({e})") from None
        if idx.options != options:
            raise OutputError(f"{out}: holds a finished conversion made with other options {idx.options}")
        return True
    staging = out / STAGING
    staging.mkdir(exist_ok=True)
    opt_path = staging / OPTIONS_NAME
    if opt_path.exists():
        if json.loads(opt_path.read_text()) != options:
            raise OutputError(f"{out}: holds an unfinished conversion made with other options; "
                              f"rerun with those ({opt_path}) or use a new folder")
    else:
        write_atomic(opt_path, json.dumps(options, sort_keys=True).encode())
    return False


# ---- one shard ----------------------------------------------------------------------------

def convert_shard(spec: DatasetSpec, cfg: ConvertConfig, out: Path, index: int, refs: list[EpisodeRef],
                  progress: Callable[[int], None], closer: ThreadPoolExecutor | None = None) -> Journal | str:
    """Write one shard from its planned episodes; returns its journal, or the error under
    --on-error fail. With a `closer` thread, fsync + rename + journal run there while the
    caller goes on: the caller must shut the closer down before it trusts the shard."""
    shard = ShardFile(out / SHARD_PATTERN.format(index=index))
    placed: list[Placed] = []
    skipped: list[EpisodeResult] = []
    decoders: dict[str, int] = {}
    try:
        for ref in refs:
            res = convert_episode(spec, ref, cfg, shard)
            progress(ref.length)
            if res.error is not None:
                if cfg.on_error == "fail":
                    shard.abort()
                    return res.error
                skipped.append(res)
                continue
            placed.append(Placed(res, index, res.base))
            for b in res.decoders.values():
                decoders[b] = decoders.get(b, 0) + 1
    except BaseException:
        shard.abort()
        raise
    planned = [r.episode_index for r in refs]
    nbytes, sha = shard.finish()
    j = Journal(index, planned, shard.path.name, nbytes, sha, placed, skipped, decoders)
    if closer is None:
        _commit_shard(out, shard, j)
        return j
    closer.submit(_commit_shard, out, shard, j)
    return j


def _commit_shard(out: Path, shard: ShardFile, j: Journal) -> None:
    """fsync + rename the shard, then journal it (the journal is the proof it is complete)."""
    shard.commit()
    write_atomic(out / STAGING / JOURNAL.format(index=j.index), pickle.dumps(j, protocol=pickle.HIGHEST_PROTOCOL))


def _is_committed(out: Path, j: Journal) -> bool:
    return (out / j.name).exists() and (out / STAGING / JOURNAL.format(index=j.index)).exists()


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
        _check_committed(out, done)
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
    _check_committed(out, done)
    return done


def _check_committed(out: Path, journals: list[Journal]) -> None:
    """Every shard reported done must be renamed and journaled (a close can fail, e.g. disk full)."""
    missing = [j.name for j in journals if not _is_committed(out, j)]
    if missing:
        raise DatakitError(f"{out / missing[0]}: shard was written but not committed (fsync/rename failed); rerun to redo it")


def load_journals(out: Path, plan: list[list[EpisodeRef]]) -> dict[int, Journal]:
    """Journals of shards that are complete, intact (re-hashed) and match the plan."""
    good: dict[int, Journal] = {}
    for i, refs in enumerate(plan):
        p = out / STAGING / JOURNAL.format(index=i)
        if not p.exists():
            continue
        try:
            with open(p, "rb") as f:
                j: Journal = pickle.load(f)
        except Exception:
            continue
        shard = out / j.name
        if (j.planned == [r.episode_index for r in refs] and shard.exists()
                and shard.stat().st_size == j.bytes and file_sha256(shard) == j.sha256):
            good[i] = j
    return good


def build_index(spec: DatasetSpec, cfg: ConvertConfig, journals: list[Journal]) -> tuple[ShardIndex, pa.Table]:
    """The manifest and the per-frame table from the shards' journals (in shard order)."""
    placed = [p for j in journals for p in j.placed]
    skipped = [s for j in journals for s in j.skipped]
    shards, row = [], 0
    for j in journals:
        n = sum(p.result.length for p in j.placed)
        eps = [p.result.episode_index for p in j.placed] or j.planned
        shards.append(ShardEntry(j.name, j.bytes, j.sha256, [eps[0], eps[-1]], [row, row + n], n))
        row += n
    cams = list(spec.cameras)
    size = cfg.size
    cameras: dict[str, CameraEntry] = {}
    for cam, cs in spec.cameras.items():
        h, w = size if size else (cs.height, cs.width)
        shape = stored_shape(cfg.layout, h, w)
        slots = [p.result.slots[cam] for p in placed]
        counts = {s: slots.count(s) for s in ("real", "blank", "missing")}
        cameras[cam] = CameraEntry(h, w, dataset_slot(slots), list(shape), int(np.prod(shape)), cs.height, cs.width, counts)
    episodes, row = [], 0
    for p in placed:
        r = p.result
        episodes.append(EpisodeEntry(r.episode_index, r.length, p.shard, row, r.task, r.slots))
        row += r.length
    sd, ad = len(spec.state_names), len(spec.action_names)
    if placed:
        state = np.concatenate([p.result.state for p in placed]).astype(np.float32).reshape(-1, sd)
        action = np.concatenate([p.result.action for p in placed]).astype(np.float32).reshape(-1, ad)
    else:
        state, action = np.zeros((0, sd), np.float32), np.zeros((0, ad), np.float32)
    cols = {
        "episode_index": np.concatenate([np.full(p.result.length, p.result.episode_index, np.int64) for p in placed] or [np.zeros(0, np.int64)]),
        "frame_index": np.concatenate([p.result.frame_index for p in placed] or [np.zeros(0, np.int64)]).astype(np.int64),
        "timestamp": np.concatenate([p.result.timestamp for p in placed] or [np.zeros(0)]).astype(np.float64),
        "task_index": np.concatenate([p.result.task_index for p in placed] or [np.zeros(0, np.int64)]).astype(np.int64),
    }
    arrays = [pa.array(cols[k]) for k in cols]
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), sd))
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), ad))
    arrays.append(pa.array(np.concatenate([np.full(p.result.length, p.shard, np.int32) for p in placed] or [np.zeros(0, np.int32)])))
    for cam in cams:
        offs = [np.where(p.result.offsets[cam] >= 0, p.result.offsets[cam] + p.base, -1) for p in placed]
        arrays.append(pa.array(np.concatenate(offs or [np.zeros(0, np.int64)]).astype(np.int64)))
    table = pa.Table.from_arrays(arrays, schema=frames_schema(cams, sd, ad))
    index = ShardIndex(
        fps=spec.fps, layout=cfg.layout, cameras=cameras, state_names=spec.state_names, action_names=spec.action_names,
        tasks=spec.tasks, stats={"state": vector_stats(state), "action": vector_stats(action)},
        shards=shards, episodes=episodes,
        skipped=[{"episode_index": s.episode_index, "source": s.source, "reason": s.error} for s in skipped],
        source={"format": spec.format, "version": spec.version, "name": spec.root.name},
        options=cfg.output_options(), num_episodes=len(episodes), num_frames=row, num_shards=len(shards),
        schema=member_schema(cameras, sd, ad),
    )
    return index, table


def convert(src: str | Path, out: str | Path, cfg: ConvertConfig) -> ConvertSummary:
    """Convert SRC into shards in OUT (resuming an interrupted run with the same options)."""
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    spec = scan(src, cfg.format)
    options = cfg.output_options()
    if prepare_output(out, options):
        shutil.rmtree(out / STAGING, ignore_errors=True)  # a crash after index.json left it behind
        return ConvertSummary(load_index(out), time.perf_counter() - t0, already_complete=True)
    plan = plan_shards(spec, cfg)
    kept = load_journals(out, plan)
    for tmp in out.glob("shard-*.tar.tmp"):  # left by a killed run
        tmp.unlink()
    jobs = [(i, refs) for i, refs in enumerate(plan) if i not in kept]
    tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked after this
    with tqdm(total=sum(r.length for _, refs in jobs for r in refs), unit="frame", desc=f"convert {src.name}",
              disable=not cfg.progress, dynamic_ncols=True, smoothing=0.1) as bar:
        new = run_shards(spec, cfg, out, jobs, bar)
    journals = sorted([*kept.values(), *new], key=lambda j: j.index)
    index, table = build_index(spec, cfg, journals)
    write_index(out, index, table)  # last: its presence means finished
    shutil.rmtree(out / STAGING, ignore_errors=True)
    decoders: dict[str, int] = {}
    for j in new:
        for b, n in j.decoders.items():
            decoders[b] = decoders.get(b, 0) + n
    return ConvertSummary(index, time.perf_counter() - t0, resumed_shards=len(kept), decoders=decoders)

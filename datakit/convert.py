"""`datakit convert SRC OUT`: episodes -> verified uint8 frame shards + global index.

Flow: scan the source -> convert episodes in a process pool (each into a tar fragment, see
episode_convert) -> append fragments in episode order into shards, rolled over at episode
boundaries past --shard-size -> after the last shard is closed, write frames.arrow, then
index.json. Each closed shard gets a journal entry in the staging folder, so a rerun after a
crash or kill -9 keeps the shards already complete (re-hashed) and produces the same bytes.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from datakit.config import ConvertConfig
from datakit.episode_convert import EpisodeResult, convert_episode
from datakit.errors import DatakitError, OutputError
from datakit.shards.index import (
    FRAMES_NAME, MANIFEST_NAME, OFFSET_PREFIX, SHARD_PATTERN, CameraEntry, EpisodeEntry, ShardEntry,
    ShardIndex, frames_schema, load_index, member_schema, write_atomic, write_frames,
)
from datakit.shards.stats import vector_stats
from datakit.shards.writer import ShardFile, sha256_file
from datakit.sources import scan
from datakit.sources.episode import DatasetSpec, EpisodeRef
from datakit.stages.colour import stored_shape
from datakit.stages.slots import dataset_slot

STAGING = ".datakit-staging"
OPTIONS_NAME = "options.json"
JOURNAL = "shard-{index:06d}.journal"


@dataclass
class Placed:
    """An episode placed in a shard: its result plus where its fragment landed."""

    result: EpisodeResult
    shard: int
    base: int


@dataclass
class Journal:
    entry: ShardEntry
    placed: list[Placed]
    skipped: list[EpisodeResult]


@dataclass
class ConvertSummary:
    index: ShardIndex
    seconds: float
    resumed_shards: int = 0
    already_complete: bool = False
    decoders: dict[str, int] = field(default_factory=dict)  # backend -> camera-episodes decoded


# ---- output folder -------------------------------------------------------------------------

def _is_ours(name: str) -> bool:
    return name in (STAGING, MANIFEST_NAME, FRAMES_NAME, MANIFEST_NAME + ".tmp", FRAMES_NAME + ".tmp") or (
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
    if (out / MANIFEST_NAME).exists():
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


def load_journals(out: Path) -> list[Journal]:
    """Journals of shards that are complete and intact, in order; stops at the first gap/damage."""
    journals: list[Journal] = []
    i = 0
    while (p := out / STAGING / JOURNAL.format(index=i)).exists():
        with open(p, "rb") as f:
            j: Journal = pickle.load(f)
        shard = out / j.entry.name
        if not shard.exists() or shard.stat().st_size != j.entry.bytes or sha256_file(shard) != j.entry.sha256:
            break
        journals.append(j)
        i += 1
    return journals


# ---- workers -------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(spec: DatasetSpec, cfg: ConvertConfig, staging: Path) -> None:
    torch.set_num_threads(1)  # parallelism is across episodes; one core per worker
    _WORKER.update(spec=spec, cfg=cfg, staging=staging)


def _run_one(ref: EpisodeRef) -> EpisodeResult:
    return convert_episode(_WORKER["spec"], ref, _WORKER["cfg"], _WORKER["staging"])


def _results(spec: DatasetSpec, refs: list[EpisodeRef], cfg: ConvertConfig, staging: Path,
             asm: "Assembler") -> Iterator[EpisodeResult]:
    """Episode results in episode order: from a process pool, or, for one worker, converted in
    this process straight into the open shard (no fragment, no copy)."""
    if cfg.workers == 1 or len(refs) <= 1:
        _init_worker(spec, cfg, staging)
        for ref in refs:
            yield convert_episode(spec, ref, cfg, staging, sink=asm.sink())
        return
    # fork starts workers in milliseconds (spawn re-imports torch and FFmpeg: ~2.5 s here). It is
    # safe here: the parent has run no torch op (no OpenMP pool) and no decoder before the pool
    # starts, and pyarrow resets its thread pool in a forked child. DATAKIT_MP_START overrides.
    method = os.environ.get("DATAKIT_MP_START", "fork" if "fork" in mp.get_all_start_methods() else "spawn")
    ctx = mp.get_context(method)
    with ctx.Pool(min(cfg.workers, len(refs)), initializer=_init_worker, initargs=(spec, cfg, staging)) as pool:
        yield from pool.imap(_run_one, refs, chunksize=1)


# ---- assembly ------------------------------------------------------------------------------

class Assembler:
    """Places episodes in shards in episode order and journals each shard when it is closed.

    A shard is closed after the first episode that takes it to --shard-size or beyond, so the
    layout depends only on the episodes, never on the number of workers. Closing (fsync, rename,
    journal) runs on one background thread, in order, while the next shard fills.
    """

    MAX_PENDING = 2  # shards waiting for their fsync before the assembler waits too

    def __init__(self, out: Path, cfg: ConvertConfig, journals: list[Journal]):
        self.out, self.cfg, self.staging = out, cfg, out / STAGING
        self.journals = journals
        self.shard: ShardFile | None = None
        self.placed: list[Placed] = []
        self.skipped: list[EpisodeResult] = []
        self._opened = len(journals)  # index of the shard being filled
        self._rows = journals[-1].entry.rows[1] if journals else 0
        self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-close")
        self._pending: list[Future] = []

    def sink(self) -> ShardFile:
        """The open shard (opened on demand), for episodes written into it directly."""
        if self.shard is None:
            self.shard = ShardFile(self.out / SHARD_PATTERN.format(index=self._opened))
        return self.shard

    def add(self, res: EpisodeResult) -> None:
        if res.error is not None:
            self.skipped.append(res)
            return
        base = self.sink().append_file(self.staging / res.fragment, res.fragment_bytes) if res.fragment else res.base
        self.placed.append(Placed(res, self._opened, base))
        if self.shard.bytes >= self.cfg.shard_size:
            self.close()

    def close(self) -> None:
        """Hand the open shard to the closer thread (if it holds any episode)."""
        if self.shard is None or not self.placed:
            return
        n = sum(p.result.length for p in self.placed)
        rows = [self._rows, self._rows + n]
        self._pending.append(self._closer.submit(self._finish, self.shard, self.placed, self.skipped, self._opened, rows))
        self._rows += n
        self._opened += 1
        self.shard, self.placed, self.skipped = None, [], []
        while len(self._pending) > self.MAX_PENDING or (self._pending and self._pending[0].done()):
            self.journals.append(self._pending.pop(0).result())

    def _finish(self, shard: ShardFile, placed: list[Placed], skipped: list[EpisodeResult], index: int,
                rows: list[int]) -> Journal:
        nbytes, sha = shard.close()
        eps = [p.result.episode_index for p in placed]
        j = Journal(ShardEntry(shard.path.name, nbytes, sha, [eps[0], eps[-1]], rows, rows[1] - rows[0]), placed, skipped)
        write_atomic(self.staging / JOURNAL.format(index=index), pickle.dumps(j, protocol=pickle.HIGHEST_PROTOCOL))
        for p in placed:  # fragments are now inside a journaled shard
            if p.result.fragment:
                (self.staging / p.result.fragment).unlink(missing_ok=True)
        return j

    def finish(self) -> None:
        """Close the last shard and wait for every close; drop a shard that got no episode."""
        self.close()
        self.abort()

    def abort(self) -> None:
        if self.shard is not None:
            self.shard.abort()
            self.shard = None
        try:  # shards already handed over are complete: let them land, so a rerun keeps them
            while self._pending:
                self.journals.append(self._pending.pop(0).result())
        finally:
            self._closer.shutdown(wait=True)


def build_index(spec: DatasetSpec, cfg: ConvertConfig, journals: list[Journal], skipped: list[EpisodeResult]) -> tuple[ShardIndex, pa.Table]:
    placed = [p for j in journals for p in j.placed]
    skipped = [s for j in journals for s in j.skipped] + skipped
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
        shards=[j.entry for j in journals], episodes=episodes,
        skipped=[{"episode_index": s.episode_index, "source": s.source, "reason": s.error} for s in skipped],
        source={"format": spec.format, "version": spec.version, "name": spec.root.name},
        options=cfg.output_options(), num_episodes=len(episodes), num_frames=row, num_shards=len(journals),
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
    journals = load_journals(out)
    done = {p.result.episode_index for j in journals for p in j.placed} | {s.episode_index for j in journals for s in j.skipped}
    last = max(done, default=-1)
    todo = [r for r in spec.episodes if r.episode_index > last]
    asm = Assembler(out, cfg, journals)
    resumed = len(journals)
    decoders: dict[str, int] = {}
    tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked after this
    bar = tqdm(total=sum(r.length for r in todo), unit="frame", desc=f"convert {src.name}", disable=not cfg.progress,
               dynamic_ncols=True, smoothing=0.1)
    try:
        for res in _results(spec, todo, cfg, out / STAGING, asm):
            if res.error is not None and cfg.on_error == "fail":
                raise DatakitError(res.error)
            asm.add(res)
            for b in res.decoders.values():
                decoders[b] = decoders.get(b, 0) + 1
            bar.update(res.length or next(r.length for r in todo if r.episode_index == res.episode_index))
        asm.finish()
    except BaseException:
        asm.abort()
        raise
    finally:
        bar.close()
    index, table = build_index(spec, cfg, asm.journals, asm.skipped)
    write_frames(out / FRAMES_NAME, table)
    write_atomic(out / MANIFEST_NAME, index.to_json().encode())  # last: its presence means finished
    shutil.rmtree(out / STAGING, ignore_errors=True)
    return ConvertSummary(index, time.perf_counter() - t0, resumed_shards=resumed, decoders=decoders)

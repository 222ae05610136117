"""The driver of `datakit encode SHARDS OUT`: the same output protocol as `datakit convert`.

Flow: open the source folder (checked like any reader) -> the fingerprint (source identity, the
encoders' digests, the options) -> claim and lock OUT (`convert/outdir.py`) -> "already complete"
for a finished OUT of the same fingerprint, refused naming what differs for another -> the clip
plan (`clips.py`: one job per source shard, plus one text shard of the distinct prompts) -> keep
the shards whose journals are valid and whose bytes still hash right, remove what a killed run
left -> the engine encodes and commits the rest -> the clip table, index.json, checksums.json,
last. kill -9 anywhere and rerun: the same bytes as an unbroken run.
"""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datakit.convert.outdir import claim_output, output_lock, remove_ours
from datakit.convert.run import remove_unfinished
from datakit.durable import write_atomic
from datakit.encode.canvas import canvas_size, resolve_slots
from datakit.encode.clips import plan_clips
from datakit.encode.config import EncodeConfig
from datakit.encode.engines import Job, run_pool, run_ray
from datakit.encode.journal import FeatureJournal, load_journal
from datakit.encode.models import feature_shapes, model_digest, model_folders
from datakit.encode.shard import clip_fields
from datakit.errors import ConfigError, OutputError, output_error
from datakit.progress import progress_bar
from datakit.shards.features import (
    FeatureIndex, FieldEntry, PromptEntry, clips_schema, load_features, torch_dtype, write_features,
)
from datakit.shards.index import ShardEntry, ShardIndex, column, conversion_id, is_finished, load_frames, load_index
from datakit.shards.names import OPTIONS_NAME, STAGING
from datakit.verify.folder import checksum_problems


@dataclass
class EncodeSummary:
    index: FeatureIndex
    seconds: float
    resumed_shards: int = 0
    already_complete: bool = False


def fingerprint(src: Path, cfg: EncodeConfig, cameras: tuple[str, ...]) -> dict[str, Any]:
    """What the features are made from and how: plain JSON, recorded in the index. `cameras`: the
    one camera, or a tiled canvas's slots (then `camera` is null and `slots` names them)."""
    fp = {
        "source": conversion_id(src),
        "vae": model_digest([cfg.vae]),
        "text_encoder": model_digest(model_folders(cfg.text_encoder, "tokenizer")) if cfg.text_encoder else None,
        "image_encoder": (model_digest(model_folders(cfg.image_encoder, "image_processor"))
                          if cfg.image_encoder else None),
        **cfg.options(),
    }
    if cfg.tile is None:
        fp["camera"] = cameras[0]
    else:
        fp["slots"] = list(cameras)
    return fp


def fingerprint_diff(old: Any, new: dict[str, Any]) -> str | None:
    """None when equal, else the first key that differs, both values shown."""
    if old == new:
        return None
    if not isinstance(old, dict):
        return "the earlier fingerprint is unreadable"
    key = next(k for k in [*new, *old] if old.get(k) != new.get(k))
    return f"{key}: {json.dumps(old.get(key))[:80]} before, {json.dumps(new.get(key))[:80]} now"


def open_output(out: Path, fp: dict[str, Any]) -> bool:
    """True when OUT holds these features finished; else staging is ready for this fingerprint. One
    rule for a finished, a foreign and an unfinished feature folder (every encode: `feature_output`)."""
    if is_finished(out):
        if problems := checksum_problems(out):
            raise OutputError(problems[0].where, f"{problems[0].what}: the feature folder is damaged; --force encodes "
                                                 "again")
        why = fingerprint_diff(load_features(out).fingerprint, fp)
        if why is not None:
            raise OutputError(out, f"holds features made otherwise ({why}); use a new folder, or --force")
        return True
    staging, path = out / STAGING, out / STAGING / OPTIONS_NAME
    try:
        staging.mkdir(exist_ok=True)
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (ValueError, RecursionError):
                old = None
            if (why := fingerprint_diff(old, fp)) is not None:
                raise OutputError(out, f"holds an unfinished encode made otherwise ({why}); rerun that command, use "
                                       "a new folder, or --force")
        else:
            shutil.rmtree(staging)
            staging.mkdir()
            write_atomic(path, json.dumps(fp, sort_keys=True).encode())
    except OSError as e:
        raise output_error(staging, e) from e
    return False


@contextmanager
def feature_output(out: Path, fp: dict[str, Any], command: str | None, force: bool) -> Iterator[bool]:
    """OUT claimed and locked for one encode (`force`: our earlier files removed first); yields True
    when it already holds these features finished. trainkit's `encode-backbone` writes through it too."""
    claim_output(out)
    with output_lock(out, command):
        if force:
            remove_ours(out)
        done = open_output(out, fp)
        if done:
            shutil.rmtree(out / STAGING, ignore_errors=True)
        yield done


def finish_features(out: Path, fi: FeatureIndex, table: pa.Table) -> None:
    """The index and checksums written last (nothing finished-looking on failure), staging removed."""
    try:
        write_features(out, fi, table)
    except OSError as e:
        remove_unfinished(out)
        raise output_error(out, e) from e
    shutil.rmtree(out / STAGING, ignore_errors=True)


def _cameras(index: ShardIndex, cfg: EncodeConfig) -> tuple[str, ...]:
    """The one camera encoded, or the tiled canvas's slots in canvas order."""
    if cfg.tile is not None:
        return resolve_slots(index, cfg.slots, cfg.tile)
    camera = cfg.camera or next(iter(index.cameras))
    if camera not in index.cameras:
        raise ConfigError("--camera", f"{camera!r} is not a camera of the source (have: {', '.join(index.cameras)})")
    return (camera,)


def plan_jobs(index: ShardIndex, frames: pa.Table, cfg: EncodeConfig,
              cameras: tuple[str, ...]) -> tuple[list[Job], list[str]]:
    """(jobs in shard order, the distinct prompts): a clip job per source shard holding clips, and
    the text job last when there is a text encoder."""
    per_shard = plan_clips(index, column(frames, "task_index"), cfg.span, cfg.seed, cfg.clips_per_episode, cameras)
    jobs = [Job(i, clips, []) for i, clips in enumerate(per_shard) if clips]
    if not jobs:
        which = f"camera {cameras[0]}" if len(cameras) == 1 else f"a camera of {', '.join(cameras)}"
        raise ConfigError("--clip", f"no episode of the source holds a clip of {cfg.span} frames "
                                    f"({cfg.frames} at stride {cfg.stride}) with {which} real")
    prompts = list(dict.fromkeys(index.tasks))
    if cfg.text_encoder is not None and prompts:
        jobs.append(Job(len(index.shards), [], prompts))
    return jobs, prompts


def _planned(job: Job) -> list[list[Any]]:
    return [[t] for t in job.prompts] if job.prompts else [[c.episode_index, c.start] for c in job.clips]


def build_features(index: ShardIndex, frames: pa.Table, cfg: EncodeConfig, fp: dict[str, Any], jobs: list[Job],
                   journals: dict[int, FeatureJournal], prompts: list[str], vae: dict[str, Any],
                   shapes: dict[str, list[int]], text_width: int) -> tuple[FeatureIndex, pa.Table]:
    """The manifest and the clip table from the plan and the journals (no shard is read)."""
    fields = clip_fields(cfg)
    state, action = column(frames, "state"), column(frames, "action")
    prompt_of = {t: p for p, t in enumerate(prompts)}
    with_text = any(job.prompts for job in jobs)
    cols: dict[str, list] = {k: [] for k in ("episode_index", "start", "task_index", "prompt", "shard", "state",
                                             "action", *fields)}
    shards, entries, row = [], [], 0
    for job in jobs:
        j = journals[job.index]
        pos = len(shards)
        shards.append(ShardEntry(j.name, j.bytes, j.sha256, [job.clips[0].episode_index, job.clips[-1].episode_index]
                                 if job.clips else [-1, -1], [row, row + len(job.clips)], len(job.clips)))
        row += len(job.clips)
        if job.prompts:
            entries = [PromptEntry(t, pos, o["text"], n) for t, o, n in zip(job.prompts, j.offsets, j.tokens)]
        for c, offs in zip(job.clips, j.offsets):
            cols["episode_index"].append(c.episode_index)
            cols["start"].append(c.start)
            cols["task_index"].append(c.task_index)
            known = with_text and 0 <= c.task_index < len(index.tasks)
            cols["prompt"].append(prompt_of[index.tasks[c.task_index]] if known else -1)
            cols["shard"].append(pos)
            cols["state"].append(state[c.row])
            cols["action"].append(action[c.row : c.row + cfg.span].reshape(-1))
            for f in fields:
                cols[f].append(offs[f])
    sd, av = len(index.state_names), cfg.span * len(index.action_names)
    schema = clips_schema(fields, sd, av)
    arrays = [pa.array(np.array(cols[k], np.int64)) for k in ("episode_index", "start", "task_index", "prompt")]
    arrays.append(pa.array(np.array(cols["shard"], np.int32)))
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(cols["state"], np.float32).reshape(-1)), sd))
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(cols["action"], np.float32).reshape(-1)), av))
    arrays += [pa.array(np.array(cols[f], np.int64)) for f in fields]
    itemsize = torch_dtype(cfg.dtype).itemsize
    feature_index = FeatureIndex(
        fingerprint=fp, fields={f: FieldEntry(cfg.dtype, shapes[f], int(np.prod(shapes[f])) * itemsize) for f in fields},
        text_width=text_width, text_dtype=cfg.dtype, prompts=entries, fps=index.fps, state_names=index.state_names,
        action_names=index.action_names, tasks=index.tasks,
        stats={k: {s: v for s, v in index.stats[k].items() if s != "nonfinite"} for k in ("state", "action")},
        span=cfg.span, vae=vae, shards=shards, num_clips=row, num_shards=len(shards))
    return feature_index, pa.Table.from_arrays(arrays, schema=schema)


def encode(src: Path, out: Path, cfg: EncodeConfig, *, force: bool = False, command: str | None = None) -> EncodeSummary:
    """Encode the shard folder `src` into the feature folder `out`, resuming an interrupted run
    of the same fingerprint; `force` starts over (our own files in OUT are removed first)."""
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    index = load_index(src)
    frames = load_frames(src, index)
    cameras = _cameras(index, cfg)
    if cfg.tile is None:
        size = cfg.size or (index.cameras[cameras[0]].height, index.cameras[cameras[0]].width)
    else:
        size = canvas_size(index, cameras, cfg.tile, cfg.size)
    shapes, vae, text_width = feature_shapes(cfg, size)
    fp = fingerprint(src, cfg, cameras)
    with feature_output(out, fp, command, force) as done:
        if done:
            return EncodeSummary(load_features(out), time.perf_counter() - t0, already_complete=True)
        jobs, prompts = plan_jobs(index, frames, cfg, cameras)
        kept = {job.index: j for job in jobs
                if (j := load_journal(out, job.index, _planned(job), ["text"] if job.prompts else clip_fields(cfg)))}
        remove_unfinished(out)  # left by a killed run
        todo = [job for job in jobs if job.index not in kept]
        with progress_bar(sum(len(job.clips) for job in todo), f"encode {src.name}", enabled=cfg.progress,
                          unit="clip", waiting="loading the encoders") as bar:
            run = run_ray if cfg.engine == "ray" else run_pool
            new = run(src, cfg, cameras, out, todo, bar)
        journals = {**kept, **{j.index: j for j in new}}
        missing = [job.index for job in jobs if job.index not in journals or not (out / journals[job.index].name).exists()]
        if missing:
            raise OutputError(out, f"shard {missing[0]} was not committed; rerun the same command to resume")
        fi, table = build_features(index, frames, cfg, fp, jobs, journals, prompts, vae, shapes, text_width)
        finish_features(out, fi, table)
    return EncodeSummary(fi, time.perf_counter() - t0, resumed_shards=len(kept))

"""`trainkit encode-backbone CONFIG --out FEATURES`: a family's frozen front run once over
`data.shards`, written as a feature folder the trainer reads with `data.shards = FEATURES`. Today
gr00t's (its `FrozenCache` record, trainkit/models/gr00t/cache.py: the ViT + LLM up to select_layer
under N1.7's deterministic view transform); docs/gr00t.md "Training the head from a cached backbone".

Why here and not in `datakit encode`: the backbone is trainkit's model (datakit never imports
trainkit), so the run lives on the trainkit side, in predict/ beside the other offline pass of a
model over shards (outside models/: it opens data and weights as the trainer does, and trainkit.data
imports models), naming no family: the record says what a sample holds. Everything about the folder
is datakit's, not a copy: the output claim, lock and fingerprint rule for a finished, foreign or
unfinished folder (`datakit.encode.run.feature_output`), the tar writer (`FeatureWriter` on an
`OutputShard`: temporary name, fsync, rename, `commit_shard`), the resume journal
(`datakit.encode.journal`), the index and checksums written last (`finish_features`), `datakit
verify` and the loader's `FeatureDataset`.

A sample is one anchor of the frame loader (every frame: N1.7's 40-step chunk is padded at an
episode's end), in the loader's order, so a run over the cache samples the same (episode, frame)
for the same seed as the run over frames. Every slot is kept (no pruning): a camera a sample lacks
is masked as the model masks it. One shard per run of consecutive anchors of one source shard;
kill it anywhere and rerun: the same bytes as an unbroken run.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from datakit.convert.run import remove_unfinished
from datakit.convert.shard import OutputShard
from datakit.encode.journal import FeatureJournal, load_journal
from datakit.encode.run import feature_output, finish_features
from datakit.encode.shard import FeatureWriter, commit_shard
from datakit.loader import ShardDataset
from datakit.progress import progress_bar
from datakit.shards.features import FeatureIndex, FieldEntry, clips_schema, load_features, torch_dtype
from datakit.shards.index import FRAME_KEY, ShardEntry, conversion_id
from datakit.shards.names import SHARD_PATTERN
from trainkit.config import RunConfig
from trainkit.data import Shards, loader_settings, read_run_shards
from trainkit.errors import ConfigError, DataError
from trainkit.models import FAMILIES, FrozenCache, build_model, family
from trainkit.parallel import compute_dtype
from trainkit.weights.load import load_weights
from trainkit.weights.shape import with_weights_shape

CACHE_KIND = "backbone"  # fingerprint["kind"]; "family" names whose (its feature_batches check both)


@dataclass
class CacheSummary:
    index: FeatureIndex
    seconds: float
    samples_encoded: int = 0
    resumed_shards: int = 0
    already_complete: bool = False

    def line(self, out: Path) -> str:
        """The one line `trainkit encode-backbone` ends with."""
        if self.already_complete:
            return f"{out}: already complete ({self.index.num_clips} samples), nothing to do"
        size = sum(e.bytes for e in self.index.shards)
        vl = self.index.fields["vl"]
        return (f"{out}: {self.index.num_clips} samples in {self.index.num_shards} shards, {size / 2**20:,.1f} MiB "
                f"({vl.bytes / 2**10:,.1f} KiB of {vl.dtype} {vl.shape[0]} x {vl.shape[1]} features each); encoded "
                f"{self.samples_encoded}, kept {self.resumed_shards} shards of an earlier run; {self.seconds:.1f} s")


@dataclass
class Job:
    index: int  # feature shard number
    positions: np.ndarray  # dataset positions (anchors) it holds, in order


def built_model(cfg: RunConfig, device: torch.device) -> torch.nn.Module:
    """The model with the run's weights, as `trainkit run` makes them: init from train.seed, then
    model.init_from; the backbone in eval mode, in the run's compute dtype."""
    fam = family(cfg.model.family)
    with torch.device("meta"):
        model = build_model(fam.name, cfg.model.preset, cfg.model.overrides)
    model.to_empty(device=device)
    torch.manual_seed(cfg.train.seed)
    model.init_weights()
    if cfg.model.init_from:
        load_weights(model, fam, cfg.model.init_from, lambda _: None)
    return model.to(compute_dtype(cfg.parallel)).eval()


def plan_jobs(dataset: ShardDataset) -> list[Job]:
    """One job per run of consecutive anchors in one source shard, in the dataset's order."""
    shard = dataset.shard[dataset.anchors]
    cuts = np.flatnonzero(np.diff(shard)) + 1
    return [Job(i, p) for i, p in enumerate(np.split(np.arange(shard.size), cuts)) if p.size]


def encode_job(model: torch.nn.Module, cache: FrozenCache, dataset: ShardDataset, adapter: Any, out: Path, job: Job,
               batch: int, device: torch.device, progress: Callable[[int], Any]) -> FeatureJournal:
    """Run the frozen front over the job's anchors `batch` at a time and commit its shard."""
    shard = OutputShard(out / SHARD_PATTERN.format(index=job.index))
    w = FeatureWriter(shard)
    norm = dataset.normaliser().to(device)
    offsets: list[dict[str, int]] = []
    try:
        for b in range(0, job.positions.size, batch):
            hb = dataset.read_batch(job.positions[b : b + batch], prune=False)
            hb = adapter.extras(hb, torch.Generator().manual_seed(0))  # the tokens; the flow draws go unused
            hb = norm({k: v.to(device) for k, v in hb.items()})
            with torch.no_grad():
                out_fields = cache.run(model, adapter.model_batch(hb))
            out_fields["action_is_pad"] = hb["action_is_pad"].to(torch.uint8)
            n = hb["action_is_pad"].shape[0]
            for k in range(n):
                key = FRAME_KEY.format(episode=int(hb["episode_index"][k]), frame=int(hb["frame_index"][k]))
                offsets.append({f: w.tensor(f"{key}.{f}.npy", t[k]) for f, t in out_fields.items()})
            progress(n)
        nbytes, sha = shard.finish()
    except BaseException:
        shard.abort()
        raise
    j = FeatureJournal(job.index, shard.path.name, nbytes, sha, planned(dataset, job), offsets, [])
    commit_shard(out, shard, j)
    return j


def planned(dataset: ShardDataset, job: Job) -> list[list[int]]:
    rows = dataset.anchors[job.positions]
    return [[int(e), int(f)] for e, f in zip(dataset.meta["episode_index"][rows], dataset.meta["frame_index"][rows])]


def clip_table(dataset: ShardDataset, jobs: list[Job], journals: dict[int, FeatureJournal],
               fields: list[str]) -> pa.Table:
    """One row per anchor: episode, frame, task, no prompt (-1), shard, raw state and the padded action chunk."""
    rows = dataset.anchors[np.concatenate([j.positions for j in jobs])]
    num = dataset.numeric(rows)
    state, action = num["state"][:, -1], num["action"]
    offs = [o for j in jobs for o in journals[j.index].offsets]
    shard = np.concatenate([np.full(j.positions.size, k, np.int32) for k, j in enumerate(jobs)])
    arrays = [pa.array(np.asarray(v, np.int64)) for v in (num["episode_index"], num["frame_index"], num["task_index"],
                                                          np.full(rows.size, -1))]
    arrays.append(pa.array(shard))
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(state.astype(np.float32).reshape(-1)), state.shape[-1]))
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(action.astype(np.float32).reshape(-1)),
                                                    action.shape[1] * action.shape[2]))
    arrays += [pa.array(np.array([o[f] for o in offs], np.int64)) for f in fields]
    schema = clips_schema(fields, state.shape[-1], action.shape[1] * action.shape[2])
    return pa.Table.from_arrays(arrays, schema=schema)


def feature_index(shards: Shards, fp: dict[str, Any], jobs: list[Job], journals: dict[int, FeatureJournal],
                  dataset: ShardDataset, fields: dict[str, tuple[str, list[int]]]) -> FeatureIndex:
    """The manifest from the plan and the journals (no shard is read); `fields`: name -> (dtype, shape)."""
    index, entries, row = shards.index, [], 0
    for j in jobs:
        jr, eps = journals[j.index], dataset.meta["episode_index"][dataset.anchors[j.positions]]
        entries.append(ShardEntry(jr.name, jr.bytes, jr.sha256, [int(eps[0]), int(eps[-1])],
                                  [row, row + j.positions.size], int(j.positions.size)))
        row += j.positions.size
    stats = {k: {s: v for s, v in index.stats[k].items() if s != "nonfinite"} for k in ("state", "action")}
    return FeatureIndex(fingerprint=fp, fields={f: FieldEntry(d, shape, math.prod(shape) * torch_dtype(d).itemsize)
                                                for f, (d, shape) in fields.items()},
                        text_width=0, text_dtype=fp["dtype"], prompts=[], fps=index.fps, state_names=index.state_names,
                        action_names=index.action_names, tasks=index.tasks, stats=stats,
                        span=fields["action_is_pad"][1][0], vae={}, shards=entries, num_clips=row,
                        num_shards=len(entries))


def encode_backbone(cfg: RunConfig, out: Path, *, batch: int = 8, force: bool = False, progress: bool = True,
                    command: str | None = None) -> CacheSummary:
    """Cache the family's frozen front over `cfg.data.shards` into the feature folder `out`, resuming
    an interrupted run of the same fingerprint; `force` starts over."""
    t0, out = time.perf_counter(), Path(out)
    fam = family(cfg.model.family)
    cache = fam.frozen_cache
    if cache is None:
        have = ", ".join(sorted(n for n, f in FAMILIES.items() if f.frozen_cache is not None))
        raise ConfigError("model.family", f"{fam.name!r} has no frozen backbone to cache (families with one: {have})")
    if batch < 1:
        raise ConfigError("--batch", "must be >= 1")
    if cfg.data.sources:
        raise ConfigError("data.sources", "encode-backbone caches one shard folder (data.shards), not a mixture")
    cfg, _ = with_weights_shape(cfg)
    with torch.device("meta"):
        mcfg = build_model(fam.name, cfg.model.preset, cfg.model.overrides).cfg
    cache.check(mcfg)
    shards = read_run_shards(cfg.data, fam.max_slots(mcfg))
    try:
        if shards.features:
            raise DataError(cfg.data.shards, "is a feature folder already; encode-backbone reads frame shards")
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        dtype = compute_dtype(cfg.parallel)
        settings = loader_settings(cfg.data, shards.slots, seed=cfg.train.seed, rank=0, world_size=1, micro_batch=batch,
                                   image_dtype=dtype, pin_memory=False)
        lcfg = fam.loader_config(mcfg, shards.index, **{**settings, "prune_slots": False})  # every slot, always
        dataset = ShardDataset(cfg.data.shards, lcfg, opened=(shards.folder, shards.cache, shards.index))
        model = built_model(cfg, device)
        name = str(dtype).removeprefix("torch.")
        fp = {"kind": CACHE_KIND, "family": fam.name, "source": conversion_id(shards.folder),
              "backbone": cache.digest(model, dtype), "model": cache.describe(mcfg),
              "slots": [s or "" for s in shards.slots], "dtype": name, "batch": batch}
        fields = {f: (d or name, shape) for f, (d, shape) in cache.fields(mcfg, len(shards.slots)).items()}
        fields["action_is_pad"] = ("uint8", [lcfg.action_horizon])
        adapter = fam.batches(mcfg, shards.index, dataset.normaliser())
        with feature_output(out, fp, command, force) as done:
            if done:
                return CacheSummary(load_features(out), time.perf_counter() - t0, already_complete=True)
            jobs = plan_jobs(dataset)
            kept = {j.index: jr for j in jobs if (jr := load_journal(out, j.index, planned(dataset, j), list(fields)))}
            remove_unfinished(out)  # left by a killed run
            todo = [j for j in jobs if j.index not in kept]
            journals = dict(kept)
            with progress_bar(sum(j.positions.size for j in todo), f"encode-backbone {Path(cfg.data.shards).name}",
                              enabled=progress, unit="sample", waiting="") as bar:
                for j in todo:
                    journals[j.index] = encode_job(model, cache, dataset, adapter, out, j, batch, device, bar.update)
            fi = feature_index(shards, fp, jobs, journals, dataset, fields)
            finish_features(out, fi, clip_table(dataset, jobs, journals, list(fields)))
        return CacheSummary(fi, time.perf_counter() - t0, samples_encoded=sum(j.positions.size for j in todo),
                            resumed_shards=len(kept))
    finally:
        shards.close()

"""Shards -> the model family's batches on the training device, through `datakit.loader`.

    shards = read_run_shards(cfg.data, fam.max_slots(model_cfg))   # once: checks, loader and resume read it
    stream = TrainData(cfg.data, shards, fam, model_cfg, seed=0, rank=r, world_size=w, micro_batch=8,
                       device=dev, image_dtype=torch.bfloat16)
    for batch in stream.batches():       # StepBatch: the family's batch on the device, endless
        loss = model(batch.model)
    ckpt["loader"] = stream.state_dict()  # (epoch, samples consumed): resumes on any world size

A weighted mixture of shard folders (`datakit.loader.MixtureSource`, one per source, from the config):
    shards = read_mixture_shards(cfg.data, sources, fam.max_slots(model_cfg), fps=cfg.data.fps)
    stream = TrainData(cfg.data, shards, fam, model_cfg, ...)   # the same stream; batch.sources says whose
Each source is opened and checked as one folder is (its own slots: the source's, else `data.slots`);
the family's loader preset and batch adapter see the first source's index with the mixture's task
list (a batch's `task_index` indexes it), and the loader normalises each item with its own source's
statistics (datakit/loader/mixture_dataset.py). Sources may store a slot's cameras at different
sizes: the device resize to the model's input is kept when any source needs it, and each size is
resized on its own, as the views of one folder whose cameras differ in size are.

The loader's `ShardDataset` + `StepSampler` give each rank its share of one global order; the
family's record says what a sample is (its loader preset) and what each batch gains on the host
that is not pixels (its batch adapter: Pi0.5's prompt tokens, flow noise and time), drawn from a
CPU generator seeded by (seed, loader epoch, the batch's slice of the global order), so they are
the same on any device, with any number of workers or ranks, and after a resume.

Two host-to-device paths, one switch (`data.h2d_dtype`):
- "uint8" (optimised): pixels stay uint8 in pinned memory, are copied on a side stream while the
  previous step computes, and are normalised on the GPU into the compute dtype (`DeviceBatcher`).
- "float32" (baseline, what LeRobot-style loaders do): normalised to float32 on the host and
  copied synchronously from pageable memory: 4x the bytes, no overlap.
`data.prune_slots` drops slots that no sample of a batch fills; off, every slot is kept and the
empty ones are zeros with `image_mask` False (the model masks them: same loss, more compute).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datakit.errors import DatakitError
from datakit.loader import LoaderConfig, MixtureSource, ShardDataset, ShardLoader
from datakit.loader.features import FeatureDataset
from datakit.loader.mixture_dataset import MixtureDataset, source_config
from datakit.shards.features import FeatureIndex, is_feature_folder, load_features
from datakit.shards.index import ShardIndex, is_finished, load_index
from datakit.shards.names import MANIFEST_NAME
from datakit.storage.cache import ShardCache
from datakit.storage.roots import open_root
from trainkit.config import DataConfig
from trainkit.errors import DataError
from trainkit.models import Family

HostBatch = dict[str, torch.Tensor]
# loader settings that describe frames (slots, pixels): not a feature folder's
FRAME_SETTINGS = ("slots", "prune_slots", "image_dtype")


@dataclass
class Shards:
    """`data.shards` opened once at start-up; the checks, the loader and the resume rules read it."""

    folder: Path  # the local folder of the index files (for a URL, the node-local cache's copy)
    cache: ShardCache | None  # a URL root's download cache (the loader downloads ahead through it)
    index: ShardIndex | FeatureIndex  # FeatureIndex: a feature folder (`datakit encode`): clips, not frames
    slots: tuple[str | None, ...]  # the model's image slots: a camera, or None for one never filled

    @property
    def features(self) -> bool:
        return isinstance(self.index, FeatureIndex)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


@dataclass
class MixtureShards:
    """A weighted mixture's sources, each opened and checked as `read_run_shards` opens one folder."""

    sources: tuple[MixtureSource, ...]  # slots resolved: each source's own, else data.slots, else its cameras
    parts: tuple[Shards, ...]  # per source, in order
    fps: float  # the rate the windows count in (LoaderConfig.fps; 0: the sources' own, which must agree)
    # (state, action) channels to pad to at least (MixtureDataset's `widths`): a subset of the sources
    # batched as the whole mixture is (one source's validation); None: the widest of these sources
    widths: tuple[int, int] | None = None

    def close(self) -> None:
        for part in self.parts:
            part.close()


def read_mixture_shards(dcfg: DataConfig, sources: Sequence[MixtureSource], max_slots: int, *,
                        fps: float = 0.0) -> MixtureShards:
    """Open every source of a mixture as `read_run_shards` opens `data.shards` (the same checks, each
    source's slots its own when it names them); a failure closes the ones already open."""
    parts: list[Shards] = []
    try:
        for src in sources:
            parts.append(read_run_shards(dcfg, max_slots, root=src.root, slots=src.slots))
    except BaseException:
        for part in parts:
            part.close()
        raise
    resolved = tuple(dataclasses.replace(src, slots=part.slots) for src, part in zip(sources, parts))
    return MixtureShards(sources=resolved, parts=tuple(parts), fps=fps)


def read_run_shards(dcfg: DataConfig, max_slots: int, *, root: str | None = None,
                    slots: tuple[str | None, ...] | None = None) -> Shards:
    """Open `data.shards` (`root`: a mixture source's folder instead, `slots` its own slots) (for a URL, its index files fetched once per node into the node-local
    shard cache, checked against the root's checksums.json; the shards themselves are downloaded
    as the loader reads) and fail early on a folder that is not finished datakit output or a slot
    naming a missing camera."""
    where = dcfg.shards if root is None else root
    try:
        folder, cache = open_root(where, cache_dir=dcfg.cache_dir or None, cache_bytes=dcfg.cache_bytes)
    except (DatakitError, ValueError, OSError) as e:  # offline, refused, not a finished root, bad URL
        raise DataError(where, f"cannot open the shard root ({e})") from None
    try:
        if is_feature_folder(folder):  # `datakit encode`'s clips, local or (through the cache) remote
            if root is not None:
                raise DataError(where, "a feature folder (datakit encode) cannot be a mixture source yet")
            return Shards(folder=folder, cache=cache, index=_checked_features(dcfg, folder), slots=())
        index, slots = _checked_index(dcfg, folder, max_slots, slots)
    except BaseException:
        if cache is not None:  # no Shards to close yet
            cache.close()
        raise
    return Shards(folder=folder, cache=cache, index=index, slots=slots)


def _checked_features(dcfg: DataConfig, folder: Path) -> FeatureIndex:
    """A feature folder's index (`folder`: its index files, for a URL the cache's copy), checked at
    open; data.features_vae (if set) against its VAE, data.slots (if set) against a tiled folder's slots."""
    try:
        index = load_features(folder)
    except DatakitError as e:
        raise DataError(dcfg.shards, f"unreadable feature folder ({e})") from None
    vae = index.fingerprint.get("vae")
    if dcfg.features_vae and vae != dcfg.features_vae:
        raise DataError(f"{dcfg.shards.rstrip('/')}/index.json", f"encoded with VAE {vae} (fingerprint.vae); the run "
                        f"wants {dcfg.features_vae} (data.features_vae)")
    tiled = index.fingerprint.get("slots")
    if dcfg.slots and tiled is not None and list(dcfg.slots) != tiled:
        raise DataError(f"{dcfg.shards.rstrip('/')}/index.json", f"tiles the slots {tiled} (fingerprint.slots); the "
                        f"run names {list(dcfg.slots)} (data.slots)")
    return index


def _checked_index(dcfg: DataConfig, root: Path, max_slots: int,
                   slots: tuple[str | None, ...] | None) -> tuple[ShardIndex, tuple[str | None, ...]]:
    if not root.is_dir():
        raise DataError(str(root), "data.shards is not a folder")
    if not (root / MANIFEST_NAME).exists() or not is_finished(root):
        raise DataError(str(root), "not a finished datakit shard folder (no index.json/checksums.json); "
                        "make one with `datakit convert SRC OUT`")
    try:
        index = load_index(root)
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(str(root / MANIFEST_NAME), f"unreadable datakit index ({e})") from None
    what = "data.slots" if slots is None else "the source's slots"
    slots = slots or tuple(s or None for s in dcfg.slots) or tuple(index.cameras)
    for cam in slots:
        if cam is not None and cam not in index.cameras:
            raise DataError(str(root), f"{what} names camera {cam!r}, which the shards lack "
                            f"(cameras: {', '.join(index.cameras)})")
    if len(slots) > max_slots:
        raise DataError(str(root), f"{what} maps {len(slots)} slots; the model has {max_slots}")
    return index, slots


def loader_settings(dcfg: DataConfig, slots: tuple[str | None, ...], *, seed: int, rank: int, world_size: int,
                    micro_batch: int, global_batch: int = 0, episodes: tuple[int, ...] | None = None,
                    image_dtype: torch.dtype, pin_memory: bool) -> dict[str, Any]:
    """The trainer's loader settings (order, workers, batch, slots, normalisation, cache), which the
    family's loader preset (`Family.loader_config`) completes with what its model asks of a sample.
    `TrainData` and `trainkit inspect` (trainkit/estimate/loader.py) both build them here."""
    h2d_f32 = dcfg.h2d_dtype == "float32"
    return dict(slots=slots, prune_slots=dcfg.prune_slots, seed=seed, batch_size=micro_batch, shuffle=dcfg.shuffle,
                rank=rank, world_size=world_size, epoch_batch=global_batch, num_workers=workers_for(dcfg.num_workers),
                prefetch_factor=dcfg.prefetch_factor, norm=dcfg.norm, episodes=episodes,
                image_dtype="float32" if h2d_f32 or image_dtype == torch.float32 else "bfloat16",
                pin_memory=pin_memory, cache_dir=dcfg.cache_dir or None, cache_bytes=dcfg.cache_bytes)


AUTO_WORKERS = 4  # the most data.num_workers = -1 starts per rank (what the GPU presets were measured with)


def workers_for(num_workers: int, cpus: int | None = None, local_ranks: int | None = None) -> int:
    """data.num_workers, -1 resolved to what the cores allow: min(AUTO_WORKERS, the cores this
    process may use (datakit.machine.available_cpus) per rank on this node (torchrun's
    LOCAL_WORLD_SIZE) - 1, for the rank itself); 0 on a one-core share."""
    if num_workers >= 0:
        return num_workers
    from datakit.machine import available_cpus

    cpus = available_cpus() if cpus is None else cpus
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if local_ranks is None else local_ranks
    return max(0, min(AUTO_WORKERS, cpus // max(1, local_ranks) - 1))


def flow_generator(seed: int, epoch: int, block: int) -> torch.Generator:
    """The CPU generator of one batch's noise and time: a pure function of its position in the
    epoch's global order (`block` = loader step x world size + rank, the sampler's slice of
    order[block * B : (block + 1) * B]), so the same samples draw the same noise on any world size."""
    key = ((seed * 1_000_003 + epoch) * 1_000_033 + block) * 1_009
    return torch.Generator().manual_seed(key % (1 << 63))


def _source_dataset(src: MixtureSource, cfg: LoaderConfig, part: Shards) -> ShardDataset:
    """One mixture source's dataset on its opened folder; DataError naming that source (e.g. its
    episodes hold no sample anchor)."""
    try:
        return ShardDataset(src.root, cfg, opened=(part.folder, part.cache, part.index))
    except ValueError as e:
        raise DataError(src.root, str(e)) from None


@dataclass
class StepBatch:
    """One micro-batch as the training loop takes it: the family's batch, and what the loop
    reads beside it from the loader's batch (never from the family's)."""

    model: Any  # the family's batch (BatchAdapter.model_batch): model(batch.model) is the loss
    samples: int  # B
    slots: int  # image slots it carries: the shape the FLOP count is a function of
    rows: torch.Tensor  # (B,) frame-table rows (sample log, non-finite report)
    actions: torch.Tensor  # (B, horizon, A) normalised action chunk (non-finite report)
    sources: torch.Tensor  # (B,) int64: each item's index in TrainData.sources (all 0 for one folder)
    epoch: int  # loader position of the batch
    step: int


class TrainData:
    """One rank's endless stream of model batches, resumable through `state_dict()`."""

    def __init__(self, dcfg: DataConfig, shards: Shards | MixtureShards, fam: Family, model_cfg: Any, *, seed: int, rank: int,
                 world_size: int, micro_batch: int, device: torch.device, image_dtype: torch.dtype,
                 global_batch: int = 0, episodes: tuple[int, ...] | None = None):
        """`global_batch`: the optimiser's (micro_batch x world_size x accumulation; 0: no
        accumulation). Epochs are whole global batches, so the sample order is the same for any
        split of it into ranks and micro-batches, and a checkpoint resumes on another world size.
        `episodes`: sample these episodes only (None: all; trainkit/validation.py's holdout); a
        mixture's are each source's own (`MixtureSource.episodes`, `validation.with_episodes`)."""
        self.dcfg, self.seed, self.rank, self.world_size, self.device = dcfg, seed, rank, world_size, device
        mixed = isinstance(shards, MixtureShards)
        first = shards.parts[0] if mixed else shards
        index = first.index
        settings = loader_settings(dcfg, first.slots, seed=seed, rank=rank, world_size=world_size,
                                   micro_batch=micro_batch, global_batch=global_batch, episodes=episodes,
                                   image_dtype=image_dtype, pin_memory=device.type == "cuda")
        if mixed:
            if episodes is not None:  # episode numbers are a source's own
                raise ValueError("a mixture samples each source's own episodes (MixtureSource.episodes)")
            settings["fps"] = shards.fps
        if first.features:  # clips of cached latents and embeddings: no frames, no slots
            if fam.feature_batches is None:
                raise DataError(dcfg.shards, f"a feature folder (datakit encode); family {fam.name} trains from "
                                             "frames only")
            self.cfg = LoaderConfig(**{k: v for k, v in settings.items() if k not in FRAME_SETTINGS})
        else:
            self.cfg = fam.loader_config(model_cfg, index, **settings)
        if mixed and not first.features:  # a source whose views are stored at another size keeps the resize
            resize = [fam.loader_config(model_cfg, p.index, **{**settings, "slots": p.slots}).resize
                      for p in shards.parts]
            self.cfg = dataclasses.replace(self.cfg, resize=next((r for r in resize if r is not None), None))
        try:
            if mixed:
                parts = [_source_dataset(src, source_config(self.cfg, src), p)
                         for src, p in zip(shards.sources, shards.parts)]
                dataset = MixtureDataset(shards.sources, self.cfg, parts=parts, widths=shards.widths)
                self.loader = ShardLoader(shards.sources, self.cfg, dataset=dataset)
                index = dataclasses.replace(index, tasks=dataset.tasks)  # task_index: the mixture's tasks
            elif first.features:
                dataset = FeatureDataset(dcfg.shards, self.cfg, opened=(shards.folder, shards.cache, index))
                self.loader = ShardLoader(dcfg.shards, self.cfg, dataset=dataset)
            else:
                dataset = ShardDataset(dcfg.shards, self.cfg, opened=(shards.folder, shards.cache, index))
                self.loader = ShardLoader(dcfg.shards, self.cfg, dataset=dataset)
        except ValueError as e:  # e.g. fewer samples than one global batch, sources at different fps
            raise DataError(shards.sources[0].root if mixed else dcfg.shards, str(e)) from None
        self.normaliser = self.loader.normaliser()  # the float32 path's host normaliser
        self.adapter = fam.feature_batches(model_cfg, index, dcfg.shards) if first.features else \
            fam.batches(model_cfg, index, self.normaliser)

    @property
    def sources(self) -> tuple[MixtureSource, ...]:
        """What `StepBatch.sources` indexes: the mixture's sources (one folder: one, named by its basename)."""
        return self.loader.sources

    # -- resumable state: the sampler position of the next batch the training loop takes --
    def state_dict(self) -> dict[str, int]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)

    @property
    def skipped(self) -> int:
        """Samples the loader dropped from delivered batches for a bad shard (on_error="skip")."""
        return self.loader.num_skipped

    def batches(self) -> Iterator[StepBatch]:
        """Model batches from the current state on, forever, from the loader's own stream (remote
        shards downloaded ahead, skipped samples counted): its device stream with the family's
        extras as the host hook, or for "float32" its host stream normalised here. Either way the
        loader's state moves past a batch as it is handed over, so a checkpoint taken after the
        step resumes at the next batch."""
        if self.dcfg.h2d_dtype == "uint8":
            stream = self.loader.device_batches(self.device, extras=self._extras)
        else:
            stream = (self._host_float32(hb) for hb in self._host_batches())
        for b in stream:
            # a cached backbone's samples carry its slots' runs, not images (BatchAdapter `slots`)
            samples, slots = b["action"].shape[0], self.slots(b) or getattr(self.adapter, "slots", 0)
            yield StepBatch(model=self.adapter.model_batch(b), samples=samples, slots=slots, rows=b["row"],
                            actions=b["action"], sources=b.get("source", torch.zeros_like(b["row"])),
                            epoch=int(b["epoch"]), step=int(b["step"]))

    @staticmethod
    def slots(b: HostBatch) -> int:
        """Image slots of a batch (the FLOP count's argument); a feature batch has none."""
        return b["images"].shape[1] if "images" in b else 0

    def _host_batches(self) -> Iterator[HostBatch]:
        while True:  # the loader's iterator ends with its epoch; the next one continues its stream
            yield from self.loader

    def _extras(self, hb: HostBatch) -> HostBatch:
        """Host side, per batch: the family's extras, from this batch's own generator."""
        block = int(hb["step"]) * self.world_size + self.rank
        return self.adapter.extras(hb, flow_generator(self.seed, int(hb["epoch"]), block))

    def _host_float32(self, hb: HostBatch) -> HostBatch:
        """Baseline path: normalise on the host in float32, then a synchronous pageable copy."""
        hb = self._extras(hb)
        meta = {k: hb[k] for k in ("epoch", "step", "num_skipped")}
        out = self.normaliser(hb, epoch=int(hb["epoch"]), step=int(hb["step"]))
        return {**{k: v.to(self.device) for k, v in out.items() if k not in meta}, **meta}

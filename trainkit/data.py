"""Shards -> the model family's batches on the training device, through `datakit.loader`.

    stream = TrainData(cfg.data, family("pi05"), model_cfg, seed=0, rank=r, world_size=w, micro_batch=8,
                       device=dev, image_dtype=torch.bfloat16)
    for batch in stream.batches():       # StepBatch: the family's batch on the device, endless
        loss = model(batch.model)
    ckpt["loader"] = stream.state_dict()  # (epoch, samples consumed): resumes on any world size

The loader's `ShardDataset` + `StepSampler` give each rank its share of one global order; the
family's record says what a sample is (its loader preset) and what each batch gains on the host
that is not pixels (its batch adapter: Pi0.5's prompt tokens, flow noise and time), drawn from a
CPU generator seeded by (seed, loader epoch, loader step, rank), so they are the same on any
device, with any number of workers, and after a resume.

Two host-to-device paths, one switch (`data.h2d_dtype`):
- "uint8" (optimised): pixels stay uint8 in pinned memory, are copied on a side stream while the
  previous step computes, and are normalised on the GPU into the compute dtype (`DeviceBatcher`).
- "float32" (baseline, what LeRobot-style loaders do): normalised to float32 on the host and
  copied synchronously from pageable memory: 4x the bytes, no overlap.
`data.prune_slots` drops slots that no sample of a batch fills; off, every slot is kept and the
empty ones are zeros with `image_mask` False (the model masks them: same loss, more compute).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datakit.loader import DeviceBatcher, LoaderConfig, Normaliser, ShardLoader
from datakit.loader.loader import host_batches
from datakit.errors import DatakitError
from datakit.shards.index import is_finished, load_index
from datakit.storage.roots import open_root
from trainkit.config import DataConfig
from trainkit.errors import DataError
from trainkit.models import Family

HostBatch = dict[str, torch.Tensor]


def index_folder(dcfg: DataConfig) -> Path:
    """The local folder holding the index files of `data.shards`: the folder itself, or for a URL
    (s3://...) the copy the node-local shard cache keeps (fetched once per node, checked against
    the root's checksums.json; the shards themselves are downloaded later, as the loader reads)."""
    try:
        folder, cache = open_root(dcfg.shards, cache_dir=dcfg.cache_dir or None, cache_bytes=dcfg.cache_bytes)
    except (DatakitError, ValueError, OSError) as e:  # offline, refused, not a finished root, bad URL
        raise DataError(dcfg.shards, f"cannot open the shard root ({e})") from None
    if cache is not None:
        cache.close()
    return folder


def check_shards(dcfg: DataConfig, max_slots: int) -> tuple[str | None, ...]:
    """Fail early on a folder that is not finished datakit output or a slot naming a missing
    camera; returns the slot mapping (None = a slot the dataset never fills)."""
    root = index_folder(dcfg)
    if not root.is_dir():
        raise DataError(str(root), "data.shards is not a folder")
    if not (root / "index.json").exists() or not is_finished(root):
        raise DataError(str(root), "not a finished datakit shard folder (no index.json/checksums.json); "
                        "make one with `datakit convert SRC OUT`")
    try:
        index = load_index(root)
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(str(root / "index.json"), f"unreadable datakit index ({e})") from None
    slots = tuple(s or None for s in dcfg.slots) or tuple(index.cameras)
    for cam in slots:
        if cam is not None and cam not in index.cameras:
            raise DataError(str(root), f"data.slots names camera {cam!r}, which the shards lack "
                            f"(cameras: {', '.join(index.cameras)})")
    if len(slots) > max_slots:
        raise DataError(str(root), f"data.slots maps {len(slots)} slots; the model has {max_slots}")
    return slots


def flow_generator(seed: int, epoch: int, step: int, rank: int) -> torch.Generator:
    """The CPU generator of one batch's noise and time: a pure function of its position."""
    key = ((seed * 1_000_003 + epoch) * 1_000_033 + step) * 1_009 + rank
    return torch.Generator().manual_seed(key % (1 << 63))


@dataclass
class StepBatch:
    """One micro-batch as the training loop takes it: the family's batch, and what the loop
    reads beside it from the loader's batch (never from the family's)."""

    model: Any  # the family's batch (BatchAdapter.model_batch): model(batch.model) is the loss
    samples: int  # B
    slots: int  # image slots it carries: the shape the FLOP count is a function of
    rows: torch.Tensor  # (B,) frame-table rows (sample log, non-finite report)
    actions: torch.Tensor  # (B, horizon, A) normalised action chunk (non-finite report)
    epoch: int  # loader position of the batch
    step: int


class TrainData:
    """One rank's endless stream of model batches, resumable through `state_dict()`."""

    def __init__(self, dcfg: DataConfig, fam: Family, model_cfg: Any, *, seed: int, rank: int, world_size: int,
                 micro_batch: int, device: torch.device, image_dtype: torch.dtype, global_batch: int = 0):
        """`global_batch`: the optimiser's (micro_batch x world_size x accumulation; 0: no
        accumulation). Epochs are whole global batches, so the sample order is the same for any
        split of it into ranks and micro-batches, and a checkpoint resumes on another world size."""
        self.dcfg, self.seed, self.rank, self.device = dcfg, seed, rank, device
        slots = check_shards(dcfg, fam.max_slots(model_cfg))
        index = load_index(index_folder(dcfg))
        h2d_f32 = dcfg.h2d_dtype == "float32"
        self.cfg: LoaderConfig = fam.loader_config(
            model_cfg, index, slots=slots, prune_slots=dcfg.prune_slots, seed=seed,
            batch_size=micro_batch, shuffle=dcfg.shuffle, rank=rank, world_size=world_size, epoch_batch=global_batch,
            num_workers=dcfg.num_workers, prefetch_factor=dcfg.prefetch_factor, norm=dcfg.norm,
            image_dtype="float32" if h2d_f32 or image_dtype == torch.float32 else "bfloat16",
            pin_memory=device.type == "cuda", cache_dir=dcfg.cache_dir or None, cache_bytes=dcfg.cache_bytes)
        try:
            self.loader = ShardLoader(dcfg.shards, self.cfg)
        except ValueError as e:  # e.g. fewer samples than one global batch
            raise DataError(dcfg.shards, str(e)) from None
        self.normaliser = Normaliser.from_index(index, self.cfg)  # the float32 path's host normaliser
        self.adapter = fam.batches(model_cfg, index, self.cfg)

    # -- resumable state: the sampler position of the next batch the training loop takes --
    def state_dict(self) -> dict[str, int]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)

    def batches(self) -> Iterator[StepBatch]:
        """Model batches from the current state on, forever."""
        s, cfg = self.loader.sampler, self.cfg
        if self.dcfg.h2d_dtype == "uint8":
            batcher = DeviceBatcher(self.normaliser, self.device, pin_memory=cfg.pin_memory)
            host = map(self._extras, host_batches(self.loader.dataset, s, cfg, s.epoch, s.step, pin=batcher.pin))
            device_batches = batcher(host)
        else:
            host = host_batches(self.loader.dataset, s, cfg, s.epoch, s.step)
            device_batches = (self._host_float32(hb) for hb in host)
        for b in device_batches:
            s.epoch, s.step = int(b["epoch"]), int(b["step"])
            s.advance()  # delivered: a checkpoint taken after this step resumes at the next batch
            samples, slots = b["images"].shape[:2]
            yield StepBatch(model=self.adapter.model_batch(b), samples=samples, slots=slots, rows=b["row"],
                            actions=b["action"], epoch=int(b["epoch"]), step=int(b["step"]))

    def _extras(self, hb: HostBatch) -> HostBatch:
        """Host side, per batch: the family's extras, from this batch's own generator."""
        return self.adapter.extras(hb, flow_generator(self.seed, int(hb["epoch"]), int(hb["step"]), self.rank))

    def _host_float32(self, hb: HostBatch) -> HostBatch:
        """Baseline path: normalise on the host in float32, then a synchronous pageable copy."""
        hb = self._extras(hb)
        meta = {k: hb[k] for k in ("epoch", "step", "num_skipped")}
        out = self.normaliser(hb, epoch=int(hb["epoch"]), step=int(hb["step"]))
        return {**{k: v.to(self.device) for k, v in out.items() if k not in meta}, **meta}

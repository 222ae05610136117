"""Shards -> `Pi05Batch` on the training device, through `datakit.loader`.

    stream = TrainData(cfg.data, model_cfg, seed=0, rank=r, world_size=w, micro_batch=8, device=dev,
                       image_dtype=torch.bfloat16)
    for batch in stream.batches():       # Pi05Batch on the device, endless
        ...
    ckpt["loader"] = stream.state_dict()  # (epoch, samples consumed): resumes on any world size

The loader's `ShardDataset` + `StepSampler` give each rank its share of one global order. On the
host, each batch gains what the model needs that is not pixels: the prompt tokens (task string +
the normalised state discretised into bins, `trainkit.models.pi05.tokenizer`) and the flow-matching
noise and time, drawn from a CPU generator seeded by (seed, loader epoch, loader step, rank), so
they are the same on any device, with any number of workers, and after a resume.

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
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from datakit.loader import DeviceBatcher, LoaderConfig, Normaliser, ShardLoader, pi05_config
from datakit.loader.loader import host_batches
from datakit.errors import DatakitError
from datakit.shards.index import is_finished, load_index
from datakit.storage.roots import open_root
from trainkit.config import DataConfig
from trainkit.errors import BatchDataError, DataError
from trainkit.models.errors import TokenizerError
from trainkit.models.pi05 import Pi05Batch, sample_flow
from trainkit.models.pi05.tokenizer import PromptTokenizer

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


class TrainData:
    """One rank's endless stream of model batches, resumable through `state_dict()`."""

    def __init__(self, dcfg: DataConfig, model_cfg: Any, *, seed: int, rank: int, world_size: int,
                 micro_batch: int, device: torch.device, image_dtype: torch.dtype, global_batch: int = 0):
        """`global_batch`: the optimiser's (micro_batch x world_size x accumulation; 0: no
        accumulation). Epochs are whole global batches, so the sample order is the same for any
        split of it into ranks and micro-batches, and a checkpoint resumes on another world size."""
        self.dcfg, self.model_cfg, self.seed, self.rank, self.device = dcfg, model_cfg, seed, rank, device
        slots = check_shards(dcfg, model_cfg.max_slots)
        index = load_index(index_folder(dcfg))
        frame_hw = tuple(index.cameras[next(c for c in slots if c is not None)].frame_shape[:2])
        size = (model_cfg.image_size, model_cfg.image_size)
        h2d_f32 = dcfg.h2d_dtype == "float32"
        self.cfg: LoaderConfig = pi05_config(
            action_horizon=model_cfg.horizon, slots=slots, prune_slots=dcfg.prune_slots, seed=seed,
            batch_size=micro_batch, shuffle=dcfg.shuffle, rank=rank, world_size=world_size, epoch_batch=global_batch,
            num_workers=dcfg.num_workers, prefetch_factor=dcfg.prefetch_factor, norm=dcfg.norm,
            image_dtype="float32" if h2d_f32 or image_dtype == torch.float32 else "bfloat16",
            resize=None if frame_hw == size or index.layout != "rgb" else size,
            pin_memory=device.type == "cuda", cache_dir=dcfg.cache_dir or None, cache_bytes=dcfg.cache_bytes)
        try:
            self.loader = ShardLoader(dcfg.shards, self.cfg)
        except ValueError as e:  # e.g. fewer samples than one global batch
            raise DataError(dcfg.shards, str(e)) from None
        self.tasks = list(index.tasks)
        self.normaliser = Normaliser.from_index(index, self.cfg)  # host copy: state for the prompt
        self.tokenizer = PromptTokenizer(model_cfg.vocab, model_cfg.text_len, model_cfg.state_bins)
        # (loader epoch, loader step, frame-table rows) of the batch `batches()` yielded last
        self.last: tuple[int, int, torch.Tensor] | None = None

    # -- resumable state: the sampler position of the next batch the training loop takes --
    def state_dict(self) -> dict[str, int]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)

    def batches(self) -> Iterator[Pi05Batch]:
        """Model batches from the current state on, forever."""
        s, cfg = self.loader.sampler, self.cfg
        if self.dcfg.h2d_dtype == "uint8":
            batcher = DeviceBatcher(self.normaliser, self.device, pin_memory=cfg.pin_memory)
            host = map(self._prompt_and_flow, host_batches(self.loader.dataset, s, cfg, s.epoch, s.step, pin=batcher.pin))
            device_batches = batcher(host)
        else:
            host = host_batches(self.loader.dataset, s, cfg, s.epoch, s.step)
            device_batches = (self._host_float32(hb) for hb in host)
        for b in device_batches:
            s.epoch, s.step = int(b["epoch"]), int(b["step"])
            self.last = (s.epoch, s.step, b["row"])  # what the batch about to be yielded holds
            s.advance()  # delivered: a checkpoint taken after this step resumes at the next batch
            yield self._model_batch(b)

    def _prompt_and_flow(self, hb: HostBatch) -> HostBatch:
        """Host side, per batch: prompt tokens and flow noise/time (small tensors, copied with it)."""
        state = hb["state"][:, -1].float() * self.normaliser.state_affine[0] + self.normaliser.state_affine[1]
        tasks = [self.tasks[i] for i in hb["task_index"].tolist()]
        try:
            tokens, token_mask = self.tokenizer.encode(tasks, state)
        except TokenizerError:
            bad = ~torch.isfinite(state).all(dim=1)
            if not bad.any():
                raise
            rows = hb["row"]  # a NaN/inf state (shards converted with --nonfinite keep): name its rows
            raise BatchDataError(rows.tolist(), rows[bad].tolist(), "non-finite state") from None
        b, c = state.shape[0], self.model_cfg
        g = flow_generator(self.seed, int(hb["epoch"]), int(hb["step"]), self.rank)
        noise, time = sample_flow(torch.zeros((b, c.horizon, c.action_dim)), g)
        return {**hb, "tokens": tokens, "token_mask": token_mask, "noise": noise, "time": time}

    def _host_float32(self, hb: HostBatch) -> HostBatch:
        """Baseline path: normalise on the host in float32, then a synchronous pageable copy."""
        hb = self._prompt_and_flow(hb)
        meta = {k: hb[k] for k in ("epoch", "step", "num_skipped")}
        out = self.normaliser(hb, epoch=int(hb["epoch"]), step=int(hb["step"]))
        return {**{k: v.to(self.device) for k, v in out.items() if k not in meta}, **meta}

    def _model_batch(self, b: HostBatch) -> Pi05Batch:
        c = self.model_cfg
        actions = b["action"]
        if actions.shape[-1] < c.action_dim:  # datasets have fewer action dims: zero-padded to 32
            actions = F.pad(actions, (0, c.action_dim - actions.shape[-1]))
        return Pi05Batch(images=b["images"][:, :, -1], image_mask=b["image_mask"], tokens=b["tokens"],
                         token_mask=b["token_mask"], actions=actions.float(), noise=b["noise"], time=b["time"])

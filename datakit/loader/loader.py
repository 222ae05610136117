"""`ShardLoader`: the training-loop entry point, host batches in the global order, resumable.

    loader = ShardLoader("out/", LoaderConfig(batch_size=32, num_workers=4, rank=r, world_size=w))
    for batch in loader.device_batches():        # normalised, on the GPU (or CPU)
        ...
        ckpt["loader"] = loader.state_dict()     # (epoch, step) of the next batch

Under the hood it is a plain `torch.utils.data.DataLoader` over `ShardDataset` with our
`StepSampler` as `batch_sampler`; the DataLoader hands out batches in sampler order whatever
the number of workers. The sampler's state advances only when a batch reaches the caller,
so batches prefetched before a checkpoint are produced again after a resume and a run
resumed at step k sees exactly the batches of an unbroken run from step k on.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.utils.data

from datakit.loader.config import LoaderConfig
from datakit.loader.dataset import ShardDataset, identity_collate
from datakit.loader.gpu_batch import DeviceBatcher
from datakit.loader.normalise import Normaliser
from datakit.loader.sampler import StepSampler, block_ids


class _EpochBatches:
    """The `batch_sampler` of one pass: a rank's batches of one epoch from a start step."""

    def __init__(self, sampler: StepSampler, epoch: int, start: int):
        self.sampler, self.epoch, self.start = sampler, epoch, start

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.iter_epoch(self.epoch, self.start)

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch - self.start


class ShardLoader:
    """Deterministic, resumable batches of `ShardDataset` for one rank."""

    def __init__(self, root: str | Path, cfg: LoaderConfig, dataset: ShardDataset | None = None):
        self.cfg = cfg
        self.dataset = dataset if dataset is not None else ShardDataset(root, cfg)
        ds = self.dataset
        blocks = block_ids(ds.shard[ds.anchors], cfg.block_size) if cfg.shuffle == "shard_block" else None
        self.sampler = StepSampler(
            num_anchors=len(ds), batch_size=cfg.batch_size, seed=cfg.seed, mode=cfg.shuffle, rank=cfg.rank,
            world_size=cfg.world_size, drop_last=cfg.drop_last, blocks=blocks,
        )
        self.num_skipped = 0

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        return self.sampler.steps_per_epoch - self.sampler.step

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """The rest of the current epoch, as host uint8 batches; then the epoch rolls over."""
        for batch in self._host_batches():
            self._delivered(batch)  # before the yield: a checkpoint taken now resumes after it
            yield batch

    def device_batches(self, device: torch.device | str | None = None, depth: int = 2) -> Iterator[dict[str, torch.Tensor]]:
        """The rest of the epoch, copied (pinned, side stream, double-buffered) and normalised.

        Batches prefetched by the device batcher do not count as delivered: the state
        advances when a batch is handed to the caller."""
        batcher = DeviceBatcher(Normaliser.from_index(self.dataset.index, self.cfg), device, depth=depth,
                                pin_memory=self.cfg.pin_memory)
        for batch in batcher(self._host_batches()):
            self._delivered(batch)
            yield batch

    def _host_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        s, cfg = self.sampler, self.cfg
        epoch, start = s.epoch, s.step
        if start >= s.steps_per_epoch:
            return
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_sampler=_EpochBatches(s, epoch, start), collate_fn=identity_collate,
            num_workers=cfg.num_workers, prefetch_factor=cfg.prefetch_factor if cfg.num_workers else None,
        )
        for step, batch in enumerate(loader, start):
            batch["epoch"] = torch.tensor(epoch)
            batch["step"] = torch.tensor(step)
            yield batch

    def _delivered(self, batch: dict[str, torch.Tensor]) -> None:
        self.num_skipped += int(batch["num_skipped"])
        self.sampler.epoch, self.sampler.step = int(batch["epoch"]), int(batch["step"])
        self.sampler.advance()

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch, self.sampler.step = epoch, 0

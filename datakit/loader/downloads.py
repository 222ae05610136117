"""Downloads ahead of the sampler: on a remote shard root, the main process tells the shard
cache (`storage.cache.ShardCache`) which shards the rank's epoch reads, in order, and where
the reader is after every batch, so shards arrive before the batches that need them.

    ahead = EpochDownloads(dataset.cache, dataset.shard[dataset.anchors], sampler)
    ahead.at(epoch, step)      # from the batch sampler, as each batch is handed to the DataLoader

Why from the batch sampler: it runs in the main process, ahead of the DataLoader workers by
their `prefetch_factor`, while the reads themselves happen in the workers, whose copies of the
cache have no download thread and download on demand (what is already there is used). A
batch touches its shards in file order, so progress is counted in batches, not in opens.

The download order of an epoch is the shard of every sample in the rank's order with consecutive
repeats collapsed (`shard_sequence`); with shuffle="shard_block" that is a few entries per
block, and the cache stays `ahead_bytes` ahead of the reader, evicting what lies behind.
"""
from __future__ import annotations

import numpy as np

from datakit.loader.sampler import StepSampler
from datakit.storage.cache import ShardCache


class EpochDownloads:
    """Feeds one rank's shard order to a `ShardCache`, epoch by epoch, and its progress."""

    def __init__(self, cache: ShardCache, shard_of_position: np.ndarray, sampler: StepSampler):
        self.cache, self.shard_of_position, self.sampler = cache, np.asarray(shard_of_position), sampler
        self._epoch: int | None = None
        self._first = 0  # first step of the current order
        self._step_pos = np.zeros(0, np.int64)  # order position of each step's first sample

    def at(self, epoch: int, step: int) -> None:
        """The batch (epoch, step) is being handed out: order the epoch's downloads when it is
        new (or when the loader jumped back), then move the reader's position to this batch."""
        if epoch != self._epoch or not self._first <= step < self._first + len(self._step_pos):
            self._start_epoch(epoch, step)
        self.cache.reader_at(int(self._step_pos[step - self._first]))

    def _start_epoch(self, epoch: int, step: int) -> None:
        per_step = self.shard_of_position[self.sampler.batches(epoch, step)]  # (steps, batch)
        flat = per_step.reshape(-1)
        new = np.r_[True, flat[1:] != flat[:-1]] if flat.size else np.zeros(0, bool)
        position = np.cumsum(new) - 1  # order position of every sample
        self._epoch, self._first = epoch, step
        self._step_pos = position[:: per_step.shape[1]] if flat.size else np.zeros(0, np.int64)
        self.cache.download_ahead(flat[new].tolist())  # what shard_sequence(flat) gives

"""Shared-memory batch slots reused across steps, so DataLoader workers hand over images by slot id.

Why: a worker that returns a fresh uint8 batch makes torch create a new shared-memory segment
per batch (and one per small tensor), fault in its ~10 MB of pages in the worker, pass the
descriptor over a socket, map and fault it in again in the main process and unmap it after.
On a 2-core machine that cost 5x the throughput of the single-process path. Here every worker
owns a ring of `slots` byte buffers, allocated once by the main process before the workers
start (inherited by fork; passed by descriptor under spawn): the worker reads frames straight
into its next free slot (`preadv` into the slot) and sends only a `SlotBatch` - slot id, image
shape and the small arrays (state, action, masks, indices; a few KB) by value in the pickle.
The main process copies the images out of the slot (into a fresh tensor, or, for the device
path, into the pinned staging buffer) and releases the slot.

Ordering: a worker fills its slots round-robin and the main process releases them in the order
it consumes batches. The DataLoader delivers a worker's batches in the order that worker made
them, so releases are FIFO per ring and "the oldest filled slot" is always the one freed;
`release` checks that. A per-worker counting semaphore (initialised to `slots`) makes a worker
wait before reusing a slot whose batch the main process has not released: a slot is never
overwritten before it is consumed. With `slots = prefetch_factor + 1` (the default) a worker
never waits: the DataLoader keeps at most `prefetch_factor` unconsumed tasks per worker, and
the main process holds at most one more batch (the one being copied).
"""
from __future__ import annotations

import multiprocessing as mp
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data

_WAIT_S = 0.1  # how often a waiting worker checks that the pool is still in use


@dataclass(frozen=True)
class SlotBatch:
    """What a worker sends instead of a batch: where its images are, the rest by value."""

    worker: int
    slot: int
    shape: tuple[int, ...]  # of the uint8 images in the slot
    arrays: dict[str, np.ndarray]  # every other batch key, in the batch's key order


class SlotPool:
    """`num_workers` rings of `slots` shared uint8 buffers of `slot_bytes` each."""

    def __init__(self, num_workers: int, slots: int, slot_bytes: int, ctx: Any = None):
        if num_workers < 1 or slots < 1 or slot_bytes < 1:
            raise ValueError(f"need num_workers, slots, slot_bytes >= 1, got {num_workers}, {slots}, {slot_bytes}")
        ctx = ctx or mp.get_context()
        self.num_workers, self.slots, self.slot_bytes = num_workers, slots, slot_bytes
        # tmpfs pages are allocated on first touch, so bytes of pruned slots cost nothing
        storage = torch.UntypedStorage._new_shared(num_workers * slots * slot_bytes)
        self.buf = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (num_workers, slots, slot_bytes))
        self._free = [ctx.Semaphore(slots) for _ in range(num_workers)]
        self._closed = ctx.Event()
        self._next = [0] * num_workers  # worker side: the ring position it fills next
        self._head = [0] * num_workers  # main side: the oldest filled, unreleased slot of each ring
        self._parent = os.getpid()

    def view(self, worker: int, slot: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The slot's first prod(shape) bytes as a uint8 tensor of `shape` (no copy)."""
        n = int(np.prod(shape))
        if n > self.slot_bytes:
            raise ValueError(f"a batch of {n} image bytes does not fit a {self.slot_bytes}-byte slot")
        return self.buf[worker, slot, :n].view(shape)

    # --- worker side ------------------------------------------------------------------------
    def acquire(self, worker: int) -> int:
        """Wait until the ring's next slot is free (its last batch released); returns it."""
        while not self._free[worker].acquire(timeout=_WAIT_S):
            orphaned = os.getpid() != self._parent and os.getppid() != self._parent
            if self._closed.is_set() or orphaned:  # nobody will ever release
                raise RuntimeError("the loader was closed; this worker's batch is not wanted")
        slot = self._next[worker]
        self._next[worker] = (slot + 1) % self.slots
        return slot

    def abort(self, worker: int) -> None:
        """Give back the slot taken by the last `acquire` (the batch failed; nothing was sent)."""
        self._next[worker] = (self._next[worker] - 1) % self.slots
        self._free[worker].release()

    # --- main side ----------------------------------------------------------------------------
    def release(self, worker: int, slot: int) -> None:
        """The main process is done with the slot: the worker may overwrite it."""
        if slot != self._head[worker]:
            raise RuntimeError(f"worker {worker}: slot {slot} released out of order (expected {self._head[worker]})")
        self._head[worker] = (slot + 1) % self.slots
        self._free[worker].release()

    def close(self) -> None:
        """The main process wants no more batches: waiting workers give up at once, so the
        DataLoader's shutdown does not sit out its join timeout on a worker stuck in `acquire`."""
        self._closed.set()

    def receive(self, msg: SlotBatch, *, borrow: bool) -> dict[str, torch.Tensor]:
        """The batch of `msg`. `borrow=False`: images copied out and the slot released now.
        `borrow=True`: images are a view of the slot; the caller must `release` it once it
        has copied them (e.g. into pinned memory), before asking the DataLoader for more."""
        images = self.view(msg.worker, msg.slot, msg.shape)
        if not borrow:
            # numpy, not torch: torch's copy splits 10 MB over its intra-op threads, which on a
            # busy 2-core machine made it 15x slower (8 ms instead of 0.6 ms) than one memcpy
            images = torch.from_numpy(images.numpy().copy())
            self.release(msg.worker, msg.slot)
        return {"images": images, **{k: torch.from_numpy(v) for k, v in msg.arrays.items()}}


class PooledDataset(torch.utils.data.Dataset):
    """What the DataLoader's workers run: `dataset.read_batch` into the worker's next slot."""

    def __init__(self, dataset: Any, pool: SlotPool):
        self.dataset, self.pool = dataset, pool

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        raise TypeError("PooledDataset only serves whole batches (`__getitems__`)")

    def __getitems__(self, positions: list[int]) -> SlotBatch:
        info = torch.utils.data.get_worker_info()
        if info is None:
            raise RuntimeError("PooledDataset runs in DataLoader workers only")
        w, pool = info.id, self.pool
        slot = pool.acquire(w)
        try:
            batch = self.dataset.read_batch(positions, alloc=lambda shape: pool.view(w, slot, shape))
            images = batch.pop("images")
            dest = pool.view(w, slot, tuple(images.shape))
            if images.numel() and images.data_ptr() != dest.data_ptr():
                dest.copy_(images)  # samples of a bad shard were dropped: the rest was compacted elsewhere
            arrays = {k: v.numpy() for k, v in batch.items()}
        except BaseException:
            pool.abort(w)
            raise
        return SlotBatch(worker=w, slot=slot, shape=tuple(images.shape), arrays=arrays)


def slot_bytes_for(dataset: Any, batch_size: int) -> int:
    """Image bytes of the largest batch `dataset` can produce (every slot kept)."""
    return max(1, batch_size * len(dataset.slot_names) * dataset.num_frames * dataset.frame_bytes)

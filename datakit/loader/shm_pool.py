"""Shared-memory ring buffers reused across steps, so DataLoader workers hand over images by buffer id.

Why: a worker that returns a fresh uint8 batch makes torch create a new shared-memory segment
per batch (and one per small tensor), fault in its ~10 MB of pages in the worker, pass the
descriptor over a socket, map and fault it in again in the main process and unmap it after.
On a 2-core machine that cost 5x the throughput of the single-process path. Here every worker
owns a ring of `buffers` byte buffers, allocated once by the main process before the workers
start (inherited by fork; passed by descriptor under spawn): the worker reads frames straight
into a free buffer (`preadv` into the buffer) and sends only a `RingBatch` - buffer id, the
images' layout (one stacked tensor, or one per slot when cameras differ in size, packed one after
the other in the same buffer) and the small arrays (state, action, masks, indices; a few KB) by value in the pickle.
The main process lends the buffer itself to the caller (`loans`: no copy; the buffer goes back
to its worker once nothing refers to the images), or copies the images out and releases it.

Buffers come back in any order (a caller may keep one batch and drop the next), so each buffer
has a shared busy flag: the worker takes a free one, the main process clears the flag on release.
A per-worker counting semaphore (initialised to `buffers`) makes a worker wait while none is
free: a buffer is never overwritten before it is released. With `buffers = prefetch_factor + 2`
(the default) a worker never waits in a training loop: the DataLoader keeps at most
`prefetch_factor` unconsumed tasks per worker, and the caller holds at most two of its batches
(the one in hand and the one before it, still bound while the next is asked for). The main
process never lends a worker's last free buffer (`host_batches`), so a caller who keeps every
batch gets copies once a worker's ring is out on loan, and the workers never deadlock.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from datakit.errors import DatakitError, ResourceLimitError
from datakit.loader.loans import Loans
from datakit.loader.slots import IMAGES, is_slot_key

_WAIT_S = 0.1  # how often a waiting worker checks that the pool is still in use
SHM_DIR = Path("/dev/shm")  # where torch's shared memory (shm_open) lives on Linux


@dataclass(frozen=True)
class RingBatch:
    """What a worker sends instead of a batch: where its images are, the rest by value."""

    worker: int
    buffer: int
    # (key, shape) of each uint8 images tensor, packed one after the other from the buffer's start:
    # ("images", (B, K, T, *frame)) alone, or ("images.<j>", (B, T, *frame_j)) per kept slot
    images: tuple[tuple[str, tuple[int, ...]], ...]
    arrays: dict[str, np.ndarray]  # every other batch key, in the batch's key order


@dataclass(frozen=True)
class WorkerFailure:
    """A worker's batch failed with a DatakitError: sent as a value so the main process raises
    the error itself (the DataLoader would turn it into a RuntimeError holding a traceback)."""

    error: Exception


def check_shm_space(need: int, what: str, shm_dir: Path = SHM_DIR) -> None:
    """Raise ResourceLimitError when `shm_dir` has less free space than `need` bytes.

    The pool's pages are allocated on first touch, so an undersized /dev/shm (Docker gives
    64 MB unless told otherwise) would otherwise end in a SIGBUS in a worker mid-epoch."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return  # no /dev/shm (not Linux): torch uses another mechanism
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise ResourceLimitError(
            f"{shm_dir}: the loader's shared memory needs {need / 2**20:.0f} MiB ({what}) but only "
            f"{free / 2**20:.0f} MiB is free; raise it (Docker: `--shm-size={_suggest(need)}`, default 64m; "
            f"Kubernetes: an emptyDir with medium Memory on /dev/shm) or lower num_workers, worker_buffers or batch_size")


def _suggest(need: int) -> str:
    gib = need / 2**30
    return f"{max(1, int(gib * 1.5 + 0.999))}g"


class BufferPool:
    """`num_workers` rings of `buffers` shared uint8 buffers of `buffer_bytes` each."""

    def __init__(self, num_workers: int, buffers: int, buffer_bytes: int, ctx: Any = None):
        if num_workers < 1 or buffers < 1 or buffer_bytes < 1:
            raise ValueError(f"need num_workers, buffers, buffer_bytes >= 1, got {num_workers}, {buffers}, {buffer_bytes}")
        ctx = ctx or mp.get_context()
        self.num_workers, self.buffers, self.buffer_bytes = num_workers, buffers, buffer_bytes
        # tmpfs pages are allocated on first touch, so bytes of pruned image slots cost nothing
        storage = torch.UntypedStorage._new_shared(num_workers * buffers * buffer_bytes)
        self.buf = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (num_workers, buffers, buffer_bytes))
        # 1 while a worker fills the buffer or its batch is unreleased
        self._busy = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(num_workers * buffers),
                                                           0, (num_workers, buffers)).zero_()
        self._free = [ctx.Semaphore(buffers) for _ in range(num_workers)]
        self._closed = ctx.Event()
        self._next = [0] * num_workers  # worker side: where its search for a free buffer starts
        self._parent = os.getpid()

    def view(self, worker: int, buffer: int, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        """The buffer's prod(shape) bytes from `offset` as a uint8 tensor of `shape` (no copy)."""
        n = math.prod(shape)
        if offset + n > self.buffer_bytes:
            raise ValueError(f"a batch of {offset + n} image bytes does not fit a {self.buffer_bytes}-byte buffer")
        return self.buf[worker, buffer, offset : offset + n].view(shape)

    # --- worker side ------------------------------------------------------------------------
    def acquire(self, worker: int) -> int:
        """Wait until one of the ring's buffers is free; returns it, taken (round robin among
        the free ones)."""
        while not self._free[worker].acquire(timeout=_WAIT_S):
            orphaned = os.getpid() != self._parent and os.getppid() != self._parent
            if self._closed.is_set() or orphaned:  # nobody will ever release
                raise RuntimeError("the loader was closed; this worker's batch is not wanted")
        busy = self._busy[worker].numpy()
        order = np.roll(np.arange(self.buffers), -self._next[worker])
        buffer = int(order[np.flatnonzero(busy[order] == 0)[0]])  # the semaphore promises one
        busy[buffer] = 1
        self._next[worker] = (buffer + 1) % self.buffers
        return buffer

    def abort(self, worker: int, buffer: int) -> None:
        """Give back a buffer taken by `acquire` (the batch failed; nothing was sent)."""
        self.release(worker, buffer)

    # --- main side ----------------------------------------------------------------------------
    def release(self, worker: int, buffer: int) -> None:
        """The main process is done with the buffer: the worker may overwrite it."""
        busy = self._busy[worker].numpy()
        if not busy[buffer]:
            raise RuntimeError(f"worker {worker}: buffer {buffer} released twice")
        busy[buffer] = 0
        self._free[worker].release()

    def close(self) -> None:
        """The main process wants no more batches: waiting workers give up at once, so the
        DataLoader's shutdown does not sit out its join timeout on a worker stuck in `acquire`."""
        self._closed.set()

    def receive(self, msg: RingBatch, loans: Loans | None) -> dict[str, torch.Tensor]:
        """The batch of `msg`. With `loans`, the images are the buffer itself, lent under the key
        (worker, buffer): `release` it once `loans.returned()` lists it (one loan for all the images
        tensors: each is a view of it). Without, the images are copied out and the buffer released now."""
        sizes = [math.prod(shape) for _, shape in msg.images]  # math.prod: a tenth of np.prod's cost
        flat = self.view(msg.worker, msg.buffer, (sum(sizes),))
        if loans is not None:
            flat = loans.lend((msg.worker, msg.buffer), flat.numpy())
        else:
            # numpy, not torch: torch's copy splits 10 MB over its intra-op threads, which on a
            # busy 2-core machine made it 15x slower (8 ms instead of 0.6 ms) than one memcpy
            flat = torch.from_numpy(flat.numpy().copy())
            self.release(msg.worker, msg.buffer)
        if len(sizes) == 1:  # one stacked tensor: the whole of it, no slice
            images = {msg.images[0][0]: flat.view(msg.images[0][1])}
        else:
            images, at = {}, 0
            for (key, shape), n in zip(msg.images, sizes):
                images[key] = flat[at : at + n].view(shape)
                at += n
        return {**images, **{k: torch.from_numpy(v) for k, v in msg.arrays.items()}}


class PooledDataset(torch.utils.data.Dataset):
    """What the DataLoader's workers run: `dataset.read_batch` into the worker's next buffer."""

    def __init__(self, dataset: Any, pool: BufferPool):
        self.dataset, self.pool = dataset, pool

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        raise TypeError("PooledDataset only serves whole batches (`__getitems__`)")

    def __getitems__(self, positions: list[int]) -> RingBatch | WorkerFailure:
        info = torch.utils.data.get_worker_info()
        if info is None:
            raise RuntimeError("PooledDataset runs in DataLoader workers only")
        w, pool = info.id, self.pool
        buffer = pool.acquire(w)
        try:
            batch = self.dataset.read_batch(positions, alloc=lambda shape: pool.view(w, buffer, shape))
            images = [(k, batch.pop(k)) for k in list(batch) if is_lent(k)]
            at = 0
            for _, t in images:
                dest = pool.view(w, buffer, tuple(t.shape), at)
                if t.numel() and t.data_ptr() != dest.data_ptr():
                    dest.copy_(t)  # samples of a bad shard were dropped: the rest was compacted elsewhere
                at += t.numel()
            arrays = {k: v.numpy() for k, v in batch.items()}
        except DatakitError as err:
            pool.abort(w, buffer)
            return WorkerFailure(err)
        except BaseException:
            pool.abort(w, buffer)
            raise
        return RingBatch(worker=w, buffer=buffer, images=tuple((k, tuple(t.shape)) for k, t in images), arrays=arrays)


FEATURE_BYTES = "feature_bytes."  # a feature batch's raw tensors (loader/features.py): lent like images


def is_lent(key: str) -> bool:
    """The batch keys that live in the worker's ring buffer (the rest travel as small arrays)."""
    return key == IMAGES or is_slot_key(key) or key.startswith(FEATURE_BYTES)


def buffer_bytes_for(dataset: Any, batch_size: int) -> int:
    """Image bytes of the largest batch `dataset` can produce (every image slot kept, each at its
    camera's frame size)."""
    return max(1, batch_size * dataset.num_frames * sum(dataset.slot_bytes))


def pool_shape(cfg: Any, dataset: Any) -> tuple[int, int, int]:
    """(workers, buffers per worker, bytes per buffer) of the pool a config needs."""
    return cfg.num_workers, cfg.worker_buffers or cfg.prefetch_factor + 2, buffer_bytes_for(dataset, cfg.batch_size)

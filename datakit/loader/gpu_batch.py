"""Host uint8 batches -> normalised device batches, the copy of step k+1 overlapping step k.

Host side: each batch is copied into one of a few reused pinned buffers (`PinnedRing`);
pinned memory is what lets `non_blocking=True` copies run asynchronously at full PCIe/NVLink
speed, and reusing it avoids a page-locking allocation per step. A buffer is overwritten
only after the event recorded behind its copy has fired. Device side: copies run on their
own stream, issued by a feeder thread together with the pinned staging; the training stream
waits on the copy's event only when it takes the batch, so with depth 2 the next batches are
already on the device while the current step computes. Without
CUDA the same iterator normalises on the CPU, so tests exercise the same code.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from datakit.loader.normalise import Normaliser

HostBatch = dict[str, torch.Tensor]


class PinnedRing:
    """`depth` sets of pinned buffers, one flat byte buffer per key, grown on demand."""

    def __init__(self, depth: int):
        self.depth = depth
        self._bufs: list[dict[str, torch.Tensor]] = [{} for _ in range(depth)]
        self._events: list[torch.cuda.Event | None] = [None] * depth
        self._next = 0

    def stage(self, batch: HostBatch) -> tuple[HostBatch, int]:
        """Copy `batch` into the next free buffer set; returns the pinned views and its number."""
        n = self._next
        self._next = (n + 1) % self.depth
        ev = self._events[n]
        if ev is not None:
            ev.synchronize()  # the copy that last read this buffer set must be done
        bufs, out = self._bufs[n], {}
        for key, t in batch.items():
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            buf = bufs.get(key)
            if buf is None or buf.numel() < nbytes:
                buf = bufs[key] = torch.empty(max(nbytes, 8), dtype=torch.uint8, pin_memory=True)
            view = buf[:nbytes].view(t.dtype).view(t.shape) if nbytes else torch.empty(t.shape, dtype=t.dtype)
            view.copy_(t)
            out[key] = view
        return out, n

    def release(self, buffer_set: int, event: torch.cuda.Event) -> None:
        self._events[buffer_set] = event


def h2d_bytes(batch: HostBatch) -> int:
    """Bytes a batch moves host-to-device."""
    return sum(t.numel() * t.element_size() for t in batch.values())


class DeviceBatcher:
    """Iterate device-ready batches from host batches (dicts of CPU tensors).

    `epoch` / `step` keys, when the loader adds them, seed the augmentations.

    A host batch may be borrowed: its images a view of a worker's shared-memory buffer, valid
    only until the next host batch is asked for (`loader.host_batches(borrow=True)`). Every
    path here is done reading it by then: pinned staging copies it, a pageable `.to()` returns
    once the source is consumed, and the CPU normaliser writes new tensors.
    """

    def __init__(self, normaliser: Normaliser, device: torch.device | str | None = None, *, depth: int = 2,
                 pin_memory: bool = True):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.normaliser = normaliser.to(self.device)
        self.depth = max(1, depth)
        self.pin = pin_memory and self.device.type == "cuda"

    def __call__(self, host_batches: Iterable[HostBatch]) -> Iterator[HostBatch]:
        if self.device.type != "cuda":
            for hb in host_batches:
                yield self.normaliser(hb, epoch=_int(hb, "epoch"), step=_int(hb, "step"))
            return
        yield from self._cuda(host_batches)

    def _cuda(self, host_batches: Iterable[HostBatch]) -> Iterator[HostBatch]:
        """A feeder thread stages into pinned memory, launches the copy and the normalisation
        on its own stream; the training thread's `next()` only takes a finished batch and
        makes its stream wait on the batch's event.

        The feeder holds `depth` credits and gets one back only when a batch is handed over,
        so its Python work (unpickling from workers, staging) runs during the training step
        instead of competing for the GIL inside `next()`."""
        ready: queue.Queue = queue.Queue()
        credits = threading.Semaphore(self.depth)
        stop = threading.Event()
        feeder = threading.Thread(target=self._feed, args=(iter(host_batches), ready, credits, stop), daemon=True)
        feeder.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, ev = item
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(ev)
                for v in batch.values():
                    if v.is_cuda:
                        v.record_stream(stream)  # the caching allocator must not recycle it under this step
                credits.release()
                yield batch
        finally:
            stop.set()
            credits.release()
            feeder.join(timeout=5.0)

    def _feed(self, it: Iterator[HostBatch], ready: queue.Queue, credits: threading.Semaphore,
              stop: threading.Event) -> None:
        try:
            torch.cuda.set_device(self.device)
            copy_stream = torch.cuda.Stream(self.device)
            ring = PinnedRing(self.depth + 1) if self.pin else None
            while True:
                credits.acquire()
                if stop.is_set():
                    return
                hb = next(it, None)
                if hb is None:
                    ready.put(_END)
                    return
                meta = {k: hb[k] for k in HOST_KEYS if k in hb}  # stay on the host: no sync to read them
                dev_keys = {k: v for k, v in hb.items() if k not in meta}
                src, buffer_set = ring.stage(dev_keys) if ring is not None else (dev_keys, -1)
                with torch.cuda.stream(copy_stream):
                    dev = {k: v.to(self.device, non_blocking=self.pin) for k, v in src.items()}
                    out = self.normaliser(dev, epoch=_int(hb, "epoch"), step=_int(hb, "step"))
                    ev = torch.cuda.Event()
                    ev.record(copy_stream)
                if ring is not None:
                    ring.release(buffer_set, ev)
                ready.put(({**out, **meta}, ev))
        except BaseException as err:  # surfaced in the training thread
            ready.put(err)


HOST_KEYS = ("epoch", "step", "num_skipped")
_END = object()


def _int(batch: HostBatch, key: str) -> int:
    v = batch.get(key)
    return int(v) if v is not None else 0

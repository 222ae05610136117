"""Host uint8 batches -> normalised device batches, the copy of step k+1 overlapping step k.

Host side: the copy to the device must read page-locked memory to run asynchronously at full
PCIe/NVLink speed (49 GB/s pinned against 12 GB/s pageable for a 9.6 MB batch on an H200 host).
With workers the images already are: the loader registers the workers' shared-memory ring with
CUDA (`pin_host`, `LoaderConfig.register_ring`) and lends its buffers, so they are copied
straight from where the workers read them. Every other tensor (and the images of a ring that is
not registered) is staged into one of a few reused pinned buffers (`PinnedRing`). A source is
held, and a staging buffer reused, only until the event recorded behind its copy has fired.
Device side: copies run on their own stream, issued by a feeder thread together with the
staging and the normalisation; the training stream waits on the copy's event only when it takes
the batch, so with depth 2 the next batches are already on the device while the current step
computes. Without CUDA the same iterator normalises on the CPU, so tests exercise the same code.
"""
from __future__ import annotations

import contextlib
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

from datakit.errors import ResourceLimitError
from datakit.loader.normalise import Normaliser

HostBatch = dict[str, torch.Tensor]
OnTake = Callable[[int, int, int], None]  # (epoch, step, num_skipped) of the batch handed over


def pin_host(t: torch.Tensor, flag: str) -> Callable[[], None]:
    """Page-lock the memory of CPU tensor `t` for CUDA (`cudaHostRegister`, portable to every
    device); returns the function that unlocks it. Fails with ResourceLimitError naming `flag`."""
    cudart, dev = torch.cuda.cudart(), torch.cuda.current_device()
    ptr, nbytes = t.data_ptr(), t.untyped_storage().nbytes()
    err = cudart.cudaHostRegister(ptr, nbytes, 1)  # 1 = cudaHostRegisterPortable
    if err != cudart.cudaError.success:
        raise ResourceLimitError(f"cudaHostRegister of {nbytes / 2**20:.0f} MiB of the loader's shared memory "
                                 f"failed ({cudart.cudaGetErrorString(err)}); set {flag}=False to stage "
                                 f"batches through a small pinned ring instead")

    def unpin() -> None:
        with torch.cuda.device(dev):
            cudart.cudaHostUnregister(ptr)
    return unpin


@contextlib.contextmanager
def gil_switch_interval(seconds: float) -> Iterator[None]:
    """The interpreter's GIL switch interval set to `seconds` inside the block (0: left as it is,
    Python's default 5 ms), restored after. The feeder thread's Python work (a family's prompt
    tokens, staging) can hold the GIL for a whole interval while the training thread waits to launch
    its next kernels; a shorter interval hands it back sooner (bench/results/loader.md)."""
    before = sys.getswitchinterval()
    if seconds > 0:
        sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class PinnedRing:
    """`depth` sets of pinned buffers, one flat byte buffer per key, grown on demand."""

    def __init__(self, depth: int):
        self.depth = depth
        self._bufs: list[dict[str, torch.Tensor]] = [{} for _ in range(depth)]
        self._events: list[torch.cuda.Event | None] = [None] * depth
        self._held: list[HostBatch] = [{} for _ in range(depth)]  # pinned sources read in place
        self._next = 0

    def stage(self, batch: HostBatch) -> tuple[HostBatch, int]:
        """Copy `batch` into the next free buffer set (tensors already pinned are used in place and
        held until its copy is done); returns the pinned tensors and the set's number."""
        self.drop_copied()
        n = self._next
        self._next = (n + 1) % self.depth
        ev = self._events[n]
        if ev is not None:
            ev.synchronize()  # the copy that last read this buffer set must be done
        bufs, out, held = self._bufs[n], {}, {}
        for key, t in batch.items():
            if t.is_pinned():
                out[key] = held[key] = t
                continue
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            buf = bufs.get(key)
            if buf is None or buf.numel() < nbytes:
                buf = bufs[key] = torch.empty(max(nbytes, 8), dtype=torch.uint8, pin_memory=True)
            view = buf[:nbytes].view(t.dtype).view(t.shape) if nbytes else torch.empty(t.shape, dtype=t.dtype)
            view.copy_(t)
            out[key] = view
        self._held[n] = held
        return out, n

    def release(self, buffer_set: int, event: torch.cuda.Event) -> None:
        self._events[buffer_set] = event

    def drop_copied(self) -> None:
        """Let go of the pinned sources whose copies have finished (a lent ring buffer goes back
        to its worker only once nothing refers to it)."""
        for n, ev in enumerate(self._events):
            if self._held[n] and ev is not None and ev.query():
                self._held[n] = {}

    def drain(self) -> None:
        """Wait for every copy from this ring, then let go of all sources."""
        for ev in self._events:
            if ev is not None:
                ev.synchronize()
        self._held = [{} for _ in range(self.depth)]


def h2d_bytes(batch: HostBatch) -> int:
    """Bytes a batch moves host-to-device."""
    return sum(t.numel() * t.element_size() for t in batch.values())


class DeviceBatcher:
    """Iterate device-ready batches from host batches (dicts of CPU tensors).

    `epoch` / `step` keys, when the loader adds them, seed the augmentations; they and
    `num_skipped` stay on the host.

    A host batch's images may be lent (`loans`): its buffer is refilled once nothing refers to
    it. The batcher holds each host batch until its bytes have been read: pinned staging copies
    it at once, a copy from page-locked memory holds it until the copy's event, a pageable `.to()`
    returns once the source is consumed, and the CPU normaliser writes new tensors.
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

    def __call__(self, host_batches: Iterable[HostBatch], on_take: OnTake | None = None) -> Iterator[HostBatch]:
        """Device batches in the order of `host_batches`. `on_take(epoch, step, num_skipped)` runs
        in the caller's thread as each batch is handed over (the loader's bookkeeping, with
        Python ints: reading a tensor there would let the feeder thread take the GIL)."""
        if self.device.type != "cuda":
            for hb in host_batches:
                out = self.normaliser(hb, epoch=_int(hb, "epoch"), step=_int(hb, "step"))
                if on_take is not None:
                    on_take(*(_int(hb, k) for k in HOST_KEYS))
                yield out
            return
        yield from self._cuda(host_batches, on_take)

    def _cuda(self, host_batches: Iterable[HostBatch], on_take: OnTake | None) -> Iterator[HostBatch]:
        """A feeder thread stages into pinned memory, launches the copy and the normalisation
        on its own stream and marks the outputs as used by the training stream; the training
        thread's `next()` only takes a finished batch and makes its stream wait on its event.

        The feeder holds `depth` credits and gets one back only when a batch is handed over,
        as the last thing `next()` does: the feeder's Python work (unpickling from workers,
        staging, launching) then runs during the training step instead of competing for the
        GIL inside `next()`. A torch call lets go of the GIL, and a feeder woken by then would
        keep it for a stretch of its Python; so `next()` makes its one torch call (the wait on
        the event) before the credit, and hands the loader its bookkeeping as Python ints. On an
        H200 host that took the data wait of a 30 ms step from 2.5% to 1.0% (bench/results/loader.md).
        The wait stays GPU-side on purpose: a feeder that synchronised on the event itself woke
        as each step ended, just when `next()` runs, and was no better.

        What `next()` does per batch is kept to the least (the profile left 0.23 ms there, 70-77 us
        of it in `torch.cuda.current_stream()`): one `SimpleQueue.get` (C, no Python lock or
        condition), the event wait, the bookkeeping, one `SimpleQueue.put` for the credit. The
        training stream is looked up once; per batch only its raw handle is compared (an int,
        `_current_raw_stream`), to notice a caller that switched streams."""
        ready: queue.SimpleQueue = queue.SimpleQueue()  # finished (batch, event, meta), _END or an error
        credits: queue.SimpleQueue = queue.SimpleQueue()  # one token per batch the feeder may launch
        for _ in range(self.depth):
            credits.put(None)
        stop = threading.Event()
        consumer = torch.cuda.current_stream(self.device)  # the feeder marks the batches used by it
        current_raw = _current_raw_stream(self.device)
        consumer_raw = consumer.cuda_stream
        feeder = threading.Thread(target=self._feed, args=(iter(host_batches), ready, credits, stop, consumer),
                                  daemon=True)
        feeder.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, ev, meta = item
                if current_raw() == consumer_raw:
                    consumer.wait_event(ev)
                else:  # the caller switched streams: the feeder marked the other one
                    stream = torch.cuda.current_stream(self.device)
                    stream.wait_event(ev)
                    _record(batch, stream)
                if on_take is not None:
                    on_take(*meta)
                credits.put(None)
                yield batch
        finally:
            stop.set()
            credits.put(None)
            feeder.join(timeout=5.0)

    def _feed(self, it: Iterator[HostBatch], ready: queue.SimpleQueue, credits: queue.SimpleQueue,
              stop: threading.Event, consumer: torch.cuda.Stream) -> None:
        ring = None
        try:
            torch.cuda.set_device(self.device)
            copy_stream = torch.cuda.Stream(self.device)
            ring = PinnedRing(self.depth + 1) if self.pin else None
            while True:
                credits.get()
                if stop.is_set():
                    return
                if ring is not None:
                    ring.drop_copied()  # lent buffers whose copies are done go back before the next read
                hb = next(it, None)
                if hb is None:
                    ready.put(_END)
                    return
                ready.put(self._launch(hb, ring, copy_stream, consumer))
                del hb  # the ring holds what a copy still reads; the rest may go back now
        except BaseException as err:  # surfaced in the training thread
            ready.put(err)
        finally:
            if ring is not None:
                ring.drain()  # no copy may still read a buffer once the host stream lets go of it

    def _launch(self, hb: HostBatch, ring: PinnedRing | None, copy_stream: torch.cuda.Stream,
                consumer: torch.cuda.Stream) -> tuple[HostBatch, torch.cuda.Event, tuple[int, ...]]:
        """Stage, copy and normalise one batch on `copy_stream`, its outputs marked as used by
        `consumer`; returns (device batch, its event, host ints)."""
        meta = {k: hb[k] for k in HOST_KEYS if k in hb}  # stay on the host: no sync to read them
        dev_keys = {k: v for k, v in hb.items() if k not in meta}
        src, buffer_set = ring.stage(dev_keys) if ring is not None else (dev_keys, -1)
        with torch.cuda.stream(copy_stream):
            dev = {k: v.to(self.device, non_blocking=self.pin) for k, v in src.items()}
            out = self.normaliser(dev, epoch=_int(hb, "epoch"), step=_int(hb, "step"))
            ev = torch.cuda.Event()
            ev.record(copy_stream)
        _record(out, consumer)
        if ring is not None:
            ring.release(buffer_set, ev)
        return {**out, **meta}, ev, tuple(_int(hb, k) for k in HOST_KEYS)


HOST_KEYS = ("epoch", "step", "num_skipped")
_END = object()


def _current_raw_stream(device: torch.device) -> Callable[[], int]:
    """A function returning the raw handle of `device`'s current stream: torch's own lookup
    (`torch._C._cuda_getCurrentRawStream`, which torch.compile's generated code calls per
    kernel launch), or, where a build lacks it, the handle of `torch.cuda.current_stream()`."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(device).cuda_stream


def _record(batch: HostBatch, stream: torch.cuda.Stream) -> None:
    """The caching allocator must not recycle a batch's memory under work queued on `stream`
    (the tensors were allocated on the copy stream)."""
    for v in batch.values():
        if v.is_cuda:
            v.record_stream(stream)


def _int(batch: HostBatch, key: str) -> int:
    v = batch.get(key)
    return int(v) if v is not None else 0

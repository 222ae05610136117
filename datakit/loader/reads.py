"""Frame bytes from shards into caller-owned buffers: coalesced `preadv`, one syscall per run.

Shards are frame-major, so the frames of a clip (and the cameras of one frame) sit close
together in one shard. `read_frames` sorts a batch's requests by (shard, offset) and merges
neighbours closer than `coalesce_gap` into one `preadv` whose iovecs scatter each frame
straight into its destination and send the gaps (other fields, tar headers) to a scratch
buffer: a 33-frame clip is one contiguous read, with no per-frame scan, no decode and no
intermediate copy. File descriptors come from `shards.open_files.OpenShards`: opened per
process (DataLoader workers fork), at most `max_open_shards` at once, checked against the index
on open (size, or sha256 once per process), so a truncated or replaced shard fails with its
name instead of returning a wrong frame.

A `preadv` may return fewer bytes than asked without being at the end of the file (Linux
moves at most 0x7ffff000 bytes per call, and a 720p clip run can be larger): `preadv_full`
continues from where it stopped; only end-of-file is a short read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from datakit.errors import ShardError

_IOV_MAX = 1000  # Linux allows 1024 iovecs per call; keep a margin


class ShardFiles(Protocol):
    """What reads need of the open shards (`shards.open_files.OpenShards`; a mixture's sources as one)."""

    def fd(self, shard: int) -> int: ...

    def path(self, shard: int) -> str | Path: ...


@dataclass
class ReadPlan:
    """Requests of one batch: frame i comes from (shard[i], offset[i]) into dest[i]."""

    shard: np.ndarray  # (R,) int
    offset: np.ndarray  # (R,) int64, byte offset of the raw pixels
    dest: list[memoryview]  # (R,) writable views, each exactly one frame long
    owner: np.ndarray  # (R,) sample of each request, to drop samples on a bad shard


def read_frames(files: ShardFiles, plan: ReadPlan, frame_bytes: int | np.ndarray,
                coalesce_gap: int) -> dict[int, ShardError]:
    """Fill every `plan.dest`; returns {shard: error} for shards that failed (never raises
    for a shard itself; the caller decides whether to raise or to drop the owners).
    `frame_bytes`: the bytes of every frame, or (R,) per request (cameras of different sizes)."""
    failed: dict[int, ShardError] = {}
    if plan.offset.size == 0:
        return failed
    order = np.lexsort((plan.offset, plan.shard))
    # padded windows repeat edge frames: read each distinct frame once, copy it to its twins
    dup = np.zeros(order.size, bool)
    dup[1:] = (plan.shard[order][1:] == plan.shard[order][:-1]) & (plan.offset[order][1:] == plan.offset[order][:-1])
    source = np.maximum.accumulate(np.where(dup, 0, np.arange(order.size)))
    twins = [(int(order[source[k]]), int(order[k])) for k in np.flatnonzero(dup).tolist()]
    order = order[~dup]
    shard_s, off_s = plan.shard[order], plan.offset[order]
    end_s = off_s + (frame_bytes[order] if isinstance(frame_bytes, np.ndarray) else frame_bytes)
    # a run breaks at a new shard or when the gap to the previous frame is too large
    gap = np.empty_like(off_s)
    gap[0] = 0
    gap[1:] = off_s[1:] - end_s[:-1]
    brk = np.ones(order.size, bool)
    brk[1:] = (shard_s[1:] != shard_s[:-1]) | (gap[1:] > coalesce_gap) | (gap[1:] < 0)
    starts = np.flatnonzero(brk).tolist() + [order.size]
    inside = gap[~brk]  # gaps that are read and discarded (breaks between runs are not)
    scratch = bytearray(max(int(inside.max()) if inside.size else 1, 1))
    for a, b in zip(starts[:-1], starts[1:]):
        shard = int(shard_s[a])
        if shard in failed:
            continue
        try:
            fd = files.fd(shard)
            _read_run(fd, [plan.dest[i] for i in order[a:b].tolist()], off_s[a:b], gap[a:b], memoryview(scratch),
                      files, shard)
        except ShardError as err:
            failed[shard] = err
    for src, dst in twins:
        plan.dest[dst][:] = plan.dest[src]
    return failed


def _read_run(fd: int, dests: list[memoryview], offs: np.ndarray, gaps: np.ndarray, scratch: memoryview,
              files: ShardFiles, shard: int) -> None:
    """One contiguous byte range: frames scattered to `dests`, gaps to `scratch`."""
    i = 0
    while i < len(dests):
        iov: list[memoryview] = []
        j = i
        while j < len(dests) and len(iov) < _IOV_MAX - 1:
            if j > i and gaps[j] > 0:
                iov.append(scratch[: int(gaps[j])])
            iov.append(dests[j])
            j += 1
        want = sum(len(v) for v in iov)
        got = preadv_full(fd, iov, int(offs[i]))
        if got != want:  # a short read means the file ended early: never hand out a partial frame
            raise ShardError(files.path(shard), f"short read at byte {int(offs[i])}: {got} of {want} bytes (truncated shard?)")
        i = j


def preadv_full(fd: int, buffers: list[memoryview], offset: int) -> int:
    """`os.preadv` until every buffer is full or the file ends; returns the bytes read.

    The kernel may fill only part of the list (at most 0x7ffff000 bytes per call on Linux):
    the next call continues with the first unfilled buffer, trimmed by what it already got."""
    iov = [memoryview(b).cast("B") for b in buffers]
    total, first = 0, 0
    while first < len(iov):
        n = os.preadv(fd, iov[first:], offset + total)
        if n <= 0:  # end of file
            break
        total += n
        while first < len(iov) and n >= len(iov[first]):
            n -= len(iov[first])
            first += 1
        if n:
            iov[first] = iov[first][n:]
    return total

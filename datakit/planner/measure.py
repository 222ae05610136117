"""This machine's read bandwidth on the shards: from disk (page cache dropped for the files
read, with posix_fadvise DONTNEED, which needs no root and touches no other file) and from the
page cache (the same bytes read again). Sequential 8 MiB reads, as `storage.cache.ShardCache` downloads and
the shard_block loader read; a `limit` bounds the bytes read so a large dataset measures fast.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

READ_CHUNK = 8 << 20


@dataclass
class Bandwidth:
    bytes_read: int
    disk_bytes_per_s: float  # first read after dropping the files from the page cache
    page_cache_bytes_per_s: float  # second read of the same bytes
    memory_bytes: int  # physical memory (the page cache cannot exceed it)


def _read(paths: list[Path], limit: int) -> tuple[int, float]:
    """Bytes read sequentially (at most `limit`) and the seconds it took."""
    buf = bytearray(READ_CHUNK)
    total, t0 = 0, time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while total < limit and (n := os.readv(fd, [buf])):
                total += n
        finally:
            os.close(fd)
        if total >= limit:
            break
    return total, time.perf_counter() - t0


def measure_bandwidth(paths: list[Path], limit: int = 1 << 30) -> Bandwidth:
    """Disk and page-cache read bandwidth over (at most `limit` bytes of) `paths`."""
    if not paths:
        raise ValueError("no shard files to measure")
    for path in paths:  # drop first, so the timed disk read starts cold
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    n, cold = _read(paths, limit)
    n2, warm = _read(paths, n)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Bandwidth(bytes_read=n, disk_bytes_per_s=n / max(cold, 1e-9), page_cache_bytes_per_s=n2 / max(warm, 1e-9),
                     memory_bytes=mem)

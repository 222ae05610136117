"""This machine's rates on the shards.

- Read bandwidth: from disk (page cache dropped for the files read, with posix_fadvise
  DONTNEED, which needs no root and touches no other file) and from the page cache (the same
  bytes read again, best of 3 passes). Sequential 8 MiB reads, as `storage.cache.ShardCache` downloads and the
  shard_block loader read; a `limit` bounds the bytes read so a large dataset measures fast.
- The loader: samples/s of the real `ShardLoader` with the plan's config (its sample shape,
  order and workers), host uint8 batches through `for batch in loader`, after warm-up batches
  that start the workers. Nothing is decoded (shards hold raw frames), nothing normalised: the
  most one rank's loader gives on this machine's cores.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from datakit.loader.config import LoaderConfig
from datakit.loader.mixture import MixtureSource
from datakit.machine import available_cpus

READ_CHUNK = 8 << 20
WARM_PASSES = 3


@dataclass
class Bandwidth:
    bytes_read: int
    disk_bytes_per_s: float  # first read after dropping the files from the page cache
    page_cache_bytes_per_s: float  # the same bytes read again (best of WARM_PASSES)
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
    read, total = [], 0
    for path in paths:  # the files the limit reaches: only these leave the page cache
        read.append(path)
        total += path.stat().st_size
        if total >= limit:
            break
    for path in read:  # drop first, so the timed disk read starts cold
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    n, cold = _read(read, limit)
    # the same bytes again, now cached: the best of a few passes, since one pass is short (~0.1 s
    # a GiB) and a moment of other work on the machine would halve it
    warm = min(_read(read, n)[1] for _ in range(WARM_PASSES))
    return Bandwidth(bytes_read=n, disk_bytes_per_s=n / max(cold, 1e-9), page_cache_bytes_per_s=n / max(warm, 1e-9),
                     memory_bytes=memory_bytes())


def memory_bytes() -> int:
    """Physical memory: the most the page cache can hold."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def warm_page_cache(paths: list[Path], limit: int) -> int:
    """Read `paths` once (at most `limit` bytes), as a first epoch would, so what follows reads
    them from the page cache; returns the bytes read."""
    return _read(paths, limit)[0]


@dataclass
class LoaderRate:
    samples_per_s: float  # one rank's loader, host batches
    samples: int  # timed samples (warm-up batches left out)
    seconds: float
    workers: int  # the config's num_workers
    cores: int  # cores this process could use


def measure_loader(root: Path | Sequence[MixtureSource], cfg: LoaderConfig, seconds: float = 3.0,
                   warmup_batches: int = 3) -> LoaderRate:
    """Samples/s of `ShardLoader(root, cfg)` (a folder, or a mixture's sources) as one rank (world size 1), timed for `seconds`
    after `warmup_batches`, across epoch ends when the dataset is small."""
    from datakit.loader.loader import ShardLoader

    loader = ShardLoader(root, dataclasses.replace(cfg, rank=0, world_size=1, epoch_batch=0))
    seen, samples, dt, t0 = 0, 0, 0.0, time.perf_counter()
    try:
        while dt < seconds:
            for batch in loader:
                seen += 1
                if seen <= warmup_batches:
                    t0 = time.perf_counter()  # the clock starts after the last warm-up batch
                    continue
                samples += batch["row"].numel()
                dt = time.perf_counter() - t0
                if dt >= seconds:
                    break
    finally:
        loader.close()
    return LoaderRate(samples_per_s=samples / dt, samples=samples, seconds=dt, workers=cfg.num_workers,
                      cores=available_cpus())

"""The file primitives of the commit protocol, one copy each: atomic write, file hash, and the
"this file has the size the index says" check. Every writer and reader of OUT goes through these,
so a crash never leaves a half-written file under a final name and every size check says the same.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from datakit.errors import ShardError

HASH_CHUNK = 8 << 20


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (the directory entry itself is data)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """The temporary name beside `path` that a writer fills before the rename (pid-tagged, never shared)."""
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_path(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """A temporary name beside `path` to write to; on a clean exit it is fsynced and renamed
    to `path`, on an exception removed: `path` is never half-written. The temporary name
    carries the pid, so two processes never share one. For writers that stream (Arrow)."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        yield tmp
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def discard(path: Path) -> None:
    """Remove a file being abandoned after an error. OUT may be what failed (made read-only, its
    disk gone): an error removing the file is ignored, so the error that stopped the run is the
    one reported, and a rerun removes the leftover."""
    try:
        Path(path).unlink(missing_ok=True)
    except OSError:
        pass


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write bytes to `path` via `atomic_path`: never half-written."""
    with atomic_path(path, durable=durable) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def file_sha256(path: Path) -> str:
    """SHA-256 of a whole file, read in large chunks (hashlib releases the GIL while hashing)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fd_sha256(fd: int) -> str:
    """SHA-256 of an open descriptor's whole file, with pread (the file position is not moved)."""
    h, off = hashlib.sha256(), 0
    while chunk := os.pread(fd, HASH_CHUNK, off):
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def check_size(path: Path, actual: int | None, expected: int) -> None:
    """Raise ShardError naming the file when it is missing (actual None) or its size is not the index's."""
    if actual is None:
        raise ShardError(path, "missing shard file")
    if actual != expected:
        raise ShardError(path, f"size {actual} differs from the index ({expected} bytes): truncated or replaced")


def file_size(path: Path) -> int | None:
    """The file's size, or None when it does not exist."""
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return None

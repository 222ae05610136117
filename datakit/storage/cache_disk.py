"""The disk side of the shard cache (`cache.ShardCache`): its lock files, what counts against
`max_bytes`, and eviction. Everything here works on one cache folder and is called under its
folder lock (FOLDER_LOCK), except `flock` itself.

What counts is what the disk holds (issue 14: the cache used to go about one shard over):
- whole shards under their final names;
- temp files of downloads in flight, at their shard's full size (a download that has just
  started will take all of it);
- evicted shards that a reader still holds open. Readers hold a shared flock on every shard
  descriptor (and memory map) they have from the cache; eviction deletes a shard only when it
  can take the exclusive lock, and otherwise moves it to EVICTED, where it counts until its
  last holder closes it (the next scan deletes it then).
A temp file whose shard lock nobody holds is a dead writer's and is deleted.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCKS = ".locks"  # one lock file per shard: held while it is downloaded
FOLDER_LOCK = ".cache.lock"  # held while room is made and a download is registered
EVICTED = ".evicted"  # evicted shards still open in a reader: counted until the last one closes them


@contextlib.contextmanager
def flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive fcntl lock on `path` (created if needed); yields False when
    non-blocking and someone else holds it. Released when the process dies, so a killed
    holder never leaves a stale lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def scan(folder: Path, sizes: dict[str, int]) -> tuple[list[tuple[str, int, float]], dict[str, int]]:
    """(whole shards as (name, bytes, mtime), {temp file name: its shard's full size}); `sizes`:
    the index's shard names and bytes."""
    whole, temps = [], {}
    for e in os.scandir(folder):
        if e.name in sizes:
            with contextlib.suppress(FileNotFoundError):
                st = e.stat()
                whole.append((e.name, st.st_size, st.st_mtime))
        elif e.name.endswith(".tmp"):
            shard = e.name.rsplit(".", 2)[0]
            if shard in sizes:
                temps[e.name] = sizes[shard]
    return whole, temps


def held_evicted(folder: Path) -> dict[str, int]:
    """{file in EVICTED: bytes} still held open by a reader; released ones are deleted here."""
    held: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(folder / EVICTED):
            try:
                fd = os.open(e.path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(e.path)
            except BlockingIOError:
                held[e.name] = os.fstat(fd).st_size
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
    return held


def used_bytes(folder: Path, sizes: dict[str, int]) -> int:
    """Bytes of shards the cache holds on disk now (whole, in flight, evicted but still open)."""
    whole, temps = scan(folder, sizes)
    return sum(size for _, size, _ in whole) + sum(temps.values()) + sum(held_evicted(folder).values())


def evict(folder: Path, name: str) -> bool:
    """Take shard `name` out of the cache; True if its disk space is free now. One that a
    reader holds open (a shared lock) moves to EVICTED, where it counts until released."""
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # open in a reader: its bytes stay on disk until it closes it
            (folder / EVICTED).mkdir(exist_ok=True)
            os.replace(path, folder / EVICTED / f"{name}.{os.getpid()}.{time.monotonic_ns()}")
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def make_room(folder: Path, sizes: dict[str, int], name: str, max_bytes: int, window: set[str],
              evict_window: bool) -> int:
    """Under the folder lock: drop dead writers' temp files and released evicted shards, then
    evict least recently used shards until shard `name` fits; returns the bytes still missing
    (0: it fits). Shards in `window` (the caller's download window) go last, and only when
    `evict_window` (a reader needs `name` now)."""
    whole, temps = scan(folder, sizes)
    for tmp in list(temps):
        shard = tmp.rsplit(".", 2)[0]
        if shard == name:
            continue
        with flock(folder / LOCKS / shard, blocking=False) as free:
            if free:  # nobody is downloading that shard: the temp file is a dead writer's
                (folder / tmp).unlink(missing_ok=True)
                del temps[tmp]
    used = sum(size for _, size, _ in whole) + sum(temps.values()) + sum(held_evicted(folder).values())
    window = window - {name}
    for shard, size, _ in sorted(whole, key=lambda w: (w[0] in window, w[2])):  # outside the window, oldest first
        if used + sizes[name] <= max_bytes:
            break
        if shard == name or (shard in window and not evict_window):
            continue
        if evict(folder, shard):
            used -= size
    return max(0, used + sizes[name] - max_bytes)

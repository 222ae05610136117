"""One run per output.dir, and an output.dir that cannot clash with the data.

    out = check_output_dir(cfg.output.dir, cfg.data.roots)   # every rank, before any GPU work
    with run_lock(out):                                        # collective: rank 0 holds the lock
        ...                                                    # resume, train, checkpoint

Two runs into one folder would resume from each other's checkpoints, delete each other's
temporary folders and log the same steps twice into metrics.jsonl. So, as datakit locks a
conversion's OUT: `fcntl.flock` on `output.dir/.trainkit.lock`, taken by rank 0 for the whole run.
The lock dies with its holder (kill -9 included), so a crashed run never blocks the next; the file
records the holder (pid, host, start, command) and a second run's error names it. Rank 0's verdict
is broadcast, so every rank of a refused launch fails together with the same line. Across nodes,
output.dir must be a shared filesystem that supports flock (NFSv4, Lustre mounted with -o flock).

output.dir may not be data.shards or inside it: the run's files would sit among the shards
(`datakit verify` and a reconversion would meet them), and a dataset folder is no place to write.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainkit.errors import OutputDirError
from trainkit.parallel.ranks import broadcast, rank_world

LOCK_NAME = ".trainkit.lock"


def check_output_dir(out_dir: str, roots: list[str]) -> Path:
    """output.dir as a Path; OutputDirError when it is a file, under a file, or in a shard folder
    of the run (`roots`: data.shards, or each of data.sources)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(out, "is a file, not a folder")
    above = next((p for p in out.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise OutputDirError(out, f"is under {above}, which is a file")
    for shards in roots:
        if "://" in shards:
            continue
        data = Path(shards).resolve()
        if out.resolve() == data or data in out.resolve().parents:
            raise OutputDirError(out, f"is data.shards {shards} or inside it; write runs outside the dataset folder")
    return out


def _holder(fd: int) -> str:
    try:
        h: Any = json.loads(os.pread(fd, 4096, 0).decode())
        text = f"pid {h['pid']} on {h['host']} since {h['since']}: {h['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
    return text if len(text) <= 300 else text[:297] + "..."  # read from the folder: keep the line short


def _acquire(out: Path) -> tuple[int | None, str | None]:
    """(descriptor holding the lock, None) or (None, why not)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        return None, f"cannot be created or written ({e.strerror})"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        why = (f"in use by another trainkit run ({_holder(fd)}); wait for it to end or stop it, "
               f"or use another output.dir")
        os.close(fd)
        return None, why
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError as e:
        os.close(fd)
        return None, f"cannot be written ({e.strerror})"
    return fd, None


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold output.dir's lock for the duration (rank 0 holds it; every rank calls this)."""
    rank, _ = rank_world()
    fd, why = _acquire(out) if rank == 0 else (None, None)
    why = broadcast(why)
    if why is not None:
        raise OutputDirError(out, why)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock; the file stays, naming the last holder

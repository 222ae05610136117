"""A checkpoint held by a reader outside the run (`trainkit export`), which the run's rotation leaves alone.

    with hold_checkpoint(run_dir / "checkpoints" / "step-000100"):   # the reader: a shared lock
        ...                                                          # read it; it stays
    remove_unless_held(folder)                                       # the rotation: deletes it, or not

The run deletes all but its newest `output.keep_checkpoints` after each save; an export reading
the newest checkpoint of a live run would lose it mid-read as soon as the next save lands (2 of 12
exports in the issue's test). So a reader takes `fcntl.flock(LOCK_SH)` on `step-N.hold` beside the
folder, and the rotation deletes a folder only under `LOCK_EX | LOCK_NB` on the same file, held
while it deletes: a held folder is kept until a later rotation finds it free. The reader takes its
hold *before* it checks the folder, so a rotation already deleting it finishes first (the reader
waits on the lock) and the reader then finds the folder gone, never half gone.

Only the rotation removes a hold file (after the folder, under its exclusive lock): a reader that
removed it could leave another reader holding a lock on a name no rotation opens any more. The
lock dies with its holder, kill -9 included. Where the hold file cannot be created (a read-only
checkpoints folder: no run is saving there), the reader goes on without a hold.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD_SUFFIX = ".hold"


def hold_path(folder: Path) -> Path:
    """The lock file of checkpoint `folder`: `step-N.hold` beside it (not a step folder, never rotated)."""
    return folder.with_name(folder.name + HOLD_SUFFIX)


@contextmanager
def hold_checkpoint(folder: Path) -> Iterator[bool]:
    """Hold `folder` against the rotation for the duration; yields False when no hold could be taken."""
    fd = _open(hold_path(Path(folder)))
    if fd is None:  # a read-only folder, or gone: no run is rotating there
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a rotation is deleting the folder
        yield True
    finally:
        os.close(fd)


def _open(path: Path) -> int | None:
    """A descriptor to lock `path` with (created if need be; read-only will do: flock needs no write)."""
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            return os.open(path, flags, 0o644)
        except OSError:
            continue
    return None


def remove_unless_held(folder: Path) -> bool:
    """Delete checkpoint `folder` and its hold file unless a reader holds it; whether it was deleted."""
    hold = hold_path(Path(folder))
    try:
        fd = os.open(hold, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # no reader could have created it either
        shutil.rmtree(folder, ignore_errors=True)
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        hold.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)

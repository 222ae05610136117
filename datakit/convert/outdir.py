"""The output-folder protocol: one OUT holds one conversion of one dataset, and nothing else.

- Ownership: OUT is absent, empty, or holds only files a conversion writes (shards, the index
  files, the staging folder, the lock); anything else and we refuse, touching nothing.
- Lock: one conversion at a time, by `fcntl.flock` on OUT/.datakit.lock, which names the
  holder (pid, host, command). The lock dies with its holder (kill -9 included); pool workers
  share it, so a rerun also waits for a dead run's workers to be gone.
- Same run: a finished OUT is "already complete", and an unfinished one is resumed, only for the
  same options and the same source fingerprint (datakit/convert/fingerprint.py); otherwise we
  refuse, naming what differs. `--force` removes our own files and starts over.

Everything read back from OUT is JSON, checked before use: a crafted OUT cannot run code.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from datakit.convert.fingerprint import fingerprint_diff
from datakit.durable import file_size, write_atomic
from datakit.errors import OutputError, Problem, output_error
from datakit.shards.index import is_finished, load_index
from datakit.shards.names import (
    CHECKSUMS_NAME, FINGERPRINT_NAME, FRAMES_NAME, LOCK_NAME, MANIFEST_NAME, OPTIONS_NAME, STAGING,
)
from datakit.sources.episode import DatasetSpec
from datakit.verify.folder import checksum_problems
from datakit.verify.quick import shard_size_problems

DEAD_HOLDER_WAIT_S = 10.0  # a killed run's workers get SIGKILL with it; give them this long to go


def is_ours(name: str) -> bool:
    """A file name that a conversion writes into OUT (final or temporary)."""
    stem = name.split(".", 1)[0] if name.endswith(".tmp") else None  # index.json.<pid>.tmp, frames.arrow.tmp
    return name in (STAGING, LOCK_NAME, MANIFEST_NAME, FRAMES_NAME, CHECKSUMS_NAME) or \
        stem in ("index", "frames", "checksums") or \
        (name.startswith("shard-") and (name.endswith(".tar") or name.endswith(".tar.tmp")))


def claim_output(out: Path) -> None:
    """Create OUT if needed; refuse a path that is not a folder or a folder holding other files."""
    if out.exists() and not out.is_dir():
        raise OutputError(out, "output path exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e) from e
    others = sorted(n for n in os.listdir(out) if not is_ours(n))
    if others:
        raise OutputError(out, f"output folder holds other files ({', '.join(others[:3])}); "
                          f"use an empty or new folder")


# ---- the lock ------------------------------------------------------------------------------

_HELD: dict[Path, int] = {}  # lock path -> descriptor, in this process


def _holder(fd: int) -> dict[str, Any]:
    try:
        d = json.loads(os.pread(fd, 4096, 0).decode())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        return {}


def _holder_text(h: dict[str, Any]) -> str:
    if not h:
        return "holder unknown"
    text = f"pid {h.get('pid')} on {h.get('host')} since {h.get('since')}: {h.get('command')}"
    return text if len(text) <= 300 else text[:297] + "..."  # read from OUT: keep the line short


def _holder_dead(h: dict[str, Any]) -> bool:
    """The recorded holder ran on this host and is gone (its workers may still be exiting)."""
    pid = h.get("pid")
    if h.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _try_lock(path: Path) -> tuple[int | None, dict[str, Any]]:
    """(descriptor, {}) when we hold the lock on `path` itself, else (None, the holder)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = _holder(fd)
            os.close(fd)
            return None, h
        try:  # the holder before us may have unlinked the file as it finished: lock the one on disk
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, {}
        os.close(fd)


@contextmanager
def output_lock(out: Path, command: str | None = None) -> Iterator[None]:
    """Hold the exclusive lock on OUT for the duration; a second holder gets an OutputError
    naming the first. The lock file is removed on release."""
    path = out / LOCK_NAME
    deadline = time.monotonic() + DEAD_HOLDER_WAIT_S
    try:
        while True:
            fd, holder = _try_lock(path)
            if fd is not None:
                break
            if not _holder_dead(holder) or time.monotonic() > deadline:
                raise OutputError(out, "another conversion is using this output folder "
                                  f"({_holder_text(holder)}); wait for it to end or stop it")
            time.sleep(0.05)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": command or " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError as e:
        raise output_error(path, e) from e
    _HELD[path] = fd
    try:
        yield
    finally:
        _HELD.pop(path, None)
        try:
            path.unlink()
        except OSError:
            pass
        os.close(fd)


# ---- the state of OUT ------------------------------------------------------------------------

def remove_ours(out: Path) -> None:
    """--force: delete the files a conversion wrote (never anything else; the lock stays)."""
    for name in os.listdir(out):
        if not is_ours(name) or name == LOCK_NAME:
            continue
        p = out / name
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError as e:
            raise output_error(p, e) from e


def _refuse(out: Path, what: str, why: str) -> OutputError:
    return OutputError(out, f"holds {what} of another source ({why}); use a new folder, "
                       f"or --force to start over")


def _damaged(out: Path, problems: list[Problem]) -> OutputError:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return OutputError(problems[0].where, f"{problems[0].what}{more}: the finished conversion in {out} is damaged "
                       f"(`datakit verify {out}` lists every problem); --force converts again")


def open_output(out: Path, options: dict[str, Any], fingerprint: dict[str, Any], spec: DatasetSpec,
                shard_size: Callable[[str], int | None] | None = None) -> bool:
    """Check that OUT (claimed and locked) belongs to this conversion; True if it is already
    complete, else the staging folder is ready (options and fingerprint recorded). A finished OUT
    is complete only if it passes the cheap checks (`verify/quick.py`: index files against
    checksums.json, each shard's size, by `shard_size(name)`, default a stat in OUT); damage is
    refused, naming it. (Redoing a damaged shard in place would rewrite a folder readers trust.)"""
    if is_finished(out):
        # checksums first: an edited index is damage (refused naming the file, with --force), and
        # load_index would only say that it differs; the options of an edited index mean nothing
        if problems := checksum_problems(out):
            raise _damaged(out, problems)
        try:
            idx = load_index(out)
        except Exception as e:
            raise OutputError(out / MANIFEST_NAME, f"unreadable index ({e})") from None
        if _comparable(idx.options) != options:
            raise OutputError(out, f"holds a finished conversion made with other options {idx.options}; "
                              f"use a new folder, or --force to start over")
        why = fingerprint_diff(idx.source.get("fingerprint") if isinstance(idx.source, dict) else None,
                               fingerprint, spec)
        if why is not None:
            raise _refuse(out, "a finished conversion", why)
        if problems := shard_size_problems(out, idx, shard_size or (lambda name: file_size(out / name))):
            raise _damaged(out, problems)
        return True
    staging = out / STAGING
    opt_path, fp_path = staging / OPTIONS_NAME, staging / FINGERPRINT_NAME
    try:
        staging.mkdir(exist_ok=True)
        if opt_path.exists():
            old = _read_json(opt_path)
            if _comparable(old) != options:
                raise OutputError(out, "holds an unfinished conversion made with other options; "
                                  f"rerun with those ({opt_path}), use a new folder, or --force to start over")
            why = fingerprint_diff(_read_json(fp_path) if fp_path.exists() else None, fingerprint, spec)
            if why is not None:
                raise _refuse(out, "an unfinished conversion", why)
        else:  # a new conversion: nothing from an earlier, unrecorded one may be resumed
            shutil.rmtree(staging)
            staging.mkdir()
            write_atomic(fp_path, json.dumps(fingerprint).encode())
            write_atomic(opt_path, json.dumps(options, sort_keys=True).encode())  # last: staging is set up
    except OSError as e:
        raise output_error(getattr(e, "filename", None) or staging, e) from e
    return False


def _comparable(recorded: Any) -> Any:
    """Options recorded by an earlier run, without the decoder that older runs recorded (it never
    changed the bytes: ConvertConfig.output_options)."""
    if isinstance(recorded, dict) and "decoder" in recorded:
        return {k: v for k, v in recorded.items() if k != "decoder"}
    return recorded


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        return None


__all__ = ["LOCK_NAME", "claim_output", "is_ours", "open_output", "output_lock", "remove_ours"]

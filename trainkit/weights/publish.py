"""An export's folder: checked, written under a working name beside OUT, sealed with a marker, renamed.

    out = check_out(out, run_dir, force)       # before anything is read: refused in a second
    with staged(out, force) as tmp:            # OUT.export-PID.tmp, its marker saying "incomplete"
        ...                                    # every file into tmp
        seal(tmp, {"checkpoint": ...})         # the marker, complete, with each file's size: written last
    # a clean exit renames tmp to OUT (with --force the old OUT is moved aside first and removed
    # once the new one is in place); an error removes tmp and leaves OUT as it was
    check_export_folder(folder)                # every reader of a weights folder, first

Why: an export written into OUT in place, killed between the weights and config.json, left new
weights beside the old config and statistics, and init_from accepted the mixture; an existing
folder (someone else's) was silently overwritten. Now OUT appears only complete, in one rename;
an existing non-empty OUT is refused unless --force, which replaces it whole, never file by file.

The reader's rule (init_from's weights and statistics, trainkit/weights/load.py, norm_stats.py):
- a folder named like export's working folders (`NAME.export-PID.tmp` while written,
  `NAME.export-PID.old` while --force replaces it) is refused, whatever it holds: unfinished or
  superseded;
- a folder holding `trainkit_export.json` is refused unless that marker is complete and every file
  it lists is there at its size (a copy taken before the export finished, a truncated file);
- a folder without the marker is not trainkit's (LeRobot's save_pretrained, openpi's converter, a
  trainkit export from before the marker) and is read as before: its completeness is its writer's
  business; the file checks (safetensors header, keys, shapes) apply to it as to every folder.
Sizes, not hashes: the full model's weights are 12 GB, and a flipped byte is found by the value
checks of the load. Working folders a killed export left are removed by the next export to the same OUT.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from datakit.durable import fsync_dir, write_atomic
from trainkit.errors import CheckpointError, ExportError

MARKER = "trainkit_export.json"
FORMAT, VERSION = "trainkit-export", 1
_WORKING = re.compile(r"\.export-(\d+)\.(tmp|old)$")
DATA_WHY = "a dataset folder is no place to write (datakit verify and a reconversion would meet the files)"
_RUN_WHY = "the run's checkpoint rotation and later runs delete and write there"


def check_out(out: Path, run_dir: Path, force: bool) -> Path:
    """OUT as an absolute path, refused when it is a file or under one, overlaps the run
    directory, or (without `force`) is a folder that is not empty."""
    out = Path(os.path.abspath(out))  # "." and "..": the working folders need OUT's own name and parent
    if not out.name:
        raise ExportError(out, "is a filesystem root; export into a folder of its own")
    if out.exists() and not out.is_dir():
        raise ExportError(out, "is a file, not a folder")
    above = next((p for p in out.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ExportError(out, f"is under {above}, which is a file")
    refuse_overlap(out, run_dir, "the run directory", _RUN_WHY)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(out, "exists and is not empty; pass --force to replace it whole, or choose another OUT")
    return out


def refuse_overlap(out: Path, folder: str | Path, what: str, why: str) -> None:
    """ExportError when OUT is `folder` or inside it, or holds it (replacing OUT would delete it)."""
    if "://" in str(folder):
        return
    o, f = Path(out).resolve(), Path(folder).resolve()
    if o == f or f in o.parents:
        raise ExportError(out, f"lies in {what} {folder}: {why}; export outside it")
    if o in f.parents:
        raise ExportError(out, f"holds {what} {folder}, which replacing OUT would delete; export elsewhere")


def working_name(out: Path, kind: str) -> Path:
    """This process's working folder beside OUT: kind "tmp" (being written) or "old" (being replaced)."""
    return out.with_name(f"{out.name}.export-{os.getpid()}.{kind}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _clear_leftovers(out: Path) -> None:
    """Remove working folders of OUT whose export is no longer running (killed, or this process's own)."""
    own = re.compile(re.escape(out.name) + _WORKING.pattern)
    for p in out.parent.iterdir() if out.parent.is_dir() else []:
        m = own.fullmatch(p.name)
        if m and p.is_dir() and (int(m.group(1)) == os.getpid() or not _alive(int(m.group(1)))):
            shutil.rmtree(p, ignore_errors=True)


def _marker(complete: bool, files: dict[str, Any] | None = None, info: dict[str, Any] | None = None) -> bytes:
    body = {"format": FORMAT, "version": VERSION, "complete": complete, **(info or {}), "files": files or {}}
    return (json.dumps(body, indent=1) + "\n").encode()


@contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """A new working folder beside OUT to write the export into; renamed to OUT on a clean exit
    (after `seal`), removed on any error (kill -9 leaves it under its working name)."""
    _clear_leftovers(out)
    tmp = working_name(out, "tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(tmp)
        write_atomic(tmp / MARKER, _marker(False))  # a copy of the folder made now says what it is
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(out, f"cannot be written ({e.strerror or e})") from None
    try:
        yield tmp
        _publish(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def seal(tmp: Path, out: Path, info: dict[str, Any]) -> None:
    """Write the marker complete, listing every file of `tmp` with its size: the last write of an export."""
    files = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size} for p in sorted(tmp.rglob("*"))
             if p.is_file() and str(p.relative_to(tmp)) != MARKER}
    try:
        write_atomic(tmp / MARKER, _marker(True, files, info))
        fsync_dir(tmp)
    except OSError as e:
        raise ExportError(out, f"cannot be written ({e.strerror or e})") from None


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Rename the sealed `tmp` to OUT; with `force` an existing OUT is moved aside first and removed
    only once the new one is in place (a kill between the renames leaves both under working names)."""
    try:
        if out.is_dir() and any(out.iterdir()):
            if not force:
                raise ExportError(out, "was filled by someone else during the export; pass --force to replace it")
            old = working_name(out, "old")
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old, out)
                raise
            fsync_dir(out.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)  # over an empty folder too
            fsync_dir(out.parent)
    except OSError as e:
        raise ExportError(out, f"cannot be renamed into place ({e.strerror or e})") from None


def check_export_folder(folder: str | Path) -> None:
    """CheckpointError when `folder` is an unfinished or superseded export, or carries an export
    marker that is not complete or does not match its files (the rule: this module's docstring)."""
    folder = Path(folder)
    m = _WORKING.search(folder.resolve().name)
    if m:
        what = ("an unfinished trainkit export (being written, or its export was killed)" if m.group(2) == "tmp"
                else "a superseded trainkit export (being replaced by export --force)")
        raise CheckpointError(str(folder), f"is {what}; read the finished OUT, or export again")
    marker = folder / MARKER
    if not (marker.exists() or marker.is_symlink()):
        return
    problem = _marker_problem(folder, marker)
    if problem:
        raise CheckpointError(str(marker), f"{problem}: an incomplete trainkit export (killed, or copied before "
                              f"it finished) or one changed since; export again, or delete {MARKER} to read the "
                              "folder as a foreign one")


def _marker_problem(folder: Path, marker: Path) -> str | None:
    try:
        raw = json.loads(marker.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        return f"unreadable ({type(e).__name__})"
    if not (isinstance(raw, dict) and raw.get("format") == FORMAT and raw.get("version") == VERSION):
        return "not a trainkit export marker"
    if raw.get("complete") is not True:
        return "says the export never completed"
    files = raw.get("files")
    if not isinstance(files, dict) or not files:
        return "lists no files"
    for name, f in sorted(files.items()):
        parts = PurePosixPath(name).parts if isinstance(name, str) and "\0" not in name else ("..",)
        if not parts or parts[0] == "/" or ".." in parts or not isinstance(f, dict) or type(f.get("bytes")) is not int:
            return f"lists {name!r} badly"
        try:
            size = (folder / name).stat().st_size
        except OSError:
            return f"lists {name}, which is missing"
        if size != f["bytes"]:
            return f"{name} has {size} bytes, the marker says {f['bytes']}"
    return None

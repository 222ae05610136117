"""`checksums.json`, the last file a conversion writes: the sha256 of index.json and frames.arrow.

Readers trust only what it records (issue 14):
- at open, `load_index` and `load_frames` compare the bytes they use with it, always: an edited
  offset, state value, shard column, stat or task fails with IndexFileError naming the file,
  and an OUT without checksums.json (unfinished, or being rewritten) is refused naming it.
  Both index files are small next to the shards (frames.arrow is ~120 bytes a frame: 1.2 GB at
  10M frames, 1-4 s of sha256 at 0.3-1 GB/s), and an unchanged frames.arrow is hashed once per
  process (`digest` remembers it by inode, size, mtime and ctime; forked loader workers inherit
  that, and the cache's own check at download counts as that hash).
- the recorded digests are the conversion's identity: a reader keeps the one it opened and
  compares it again whenever it opens a shard (`OpenShards`), so an OUT rewritten under it
  (`datakit convert OTHER OUT --force`) fails with one line instead of returning the other
  conversion's frames. The identity is content, not a random id: an unchanged rerun gives
  byte-identical output, checksums.json included.
`datakit verify` reads the same file but lists a mismatch as a problem instead of raising.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from datakit.errors import IndexFileError
from datakit.shards.names import CHECKSUMS_NAME

_HEX = re.compile(r"[0-9a-f]{64}")
# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) -> sha256 of a file hashed in this process;
# ctime cannot be set from user space, so any write to the file gives a new key
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}


def recorded(out: Path, names: tuple[str, ...]) -> dict[str, str]:
    """{name: sha256} that `out`'s checksums.json records for `names`; IndexFileError naming
    checksums.json when it is missing, unreadable or malformed."""
    path = Path(out) / CHECKSUMS_NAME
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise IndexFileError(path, "missing: the conversion into this folder did not finish (or it is being "
                                   "rewritten); readers use finished conversions only") from None
    except OSError as e:
        raise IndexFileError(path, f"unreadable ({e.strerror or e})") from None
    return parse(text, path, names)


def parse(text: bytes, where: str | Path, names: tuple[str, ...]) -> dict[str, str]:
    """{name: sha256} for `names` from the text of a checksums.json; IndexFileError naming
    `where` (a path or URL) when it is not one."""
    try:
        sums = json.loads(text)["sha256"]
        want = {name: sums[name] for name in names}
    except RecursionError:  # valid JSON, but nested deeper than the parser recurses
        raise IndexFileError(where, "not a checksums file: nested too deeply to parse") from None
    except (ValueError, KeyError, TypeError) as e:
        raise IndexFileError(where, f"not a checksums file ({type(e).__name__}: {e})") from None
    bad = next((n for n, d in want.items() if not isinstance(d, str) or not _HEX.fullmatch(d)), None)
    if bad is not None:
        raise IndexFileError(where, f"sha256.{bad}: {want[bad]!r} is not a sha256 hex digest")
    return want


def digest(data: memoryview | bytes, st: os.stat_result | None = None) -> str:
    """sha256 of `data`; with `st` (the stat of the file `data` maps), remembered for that file."""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if st is not None else None
    if key is not None and key in _DIGESTS:
        return _DIGESTS[key]
    value = hashlib.sha256(data).hexdigest()
    if key is not None:
        _DIGESTS[key] = value
    return value


def remember(path: Path, value: str) -> None:
    """Record that the file at `path`, as it is now, has sha256 `value` (the cache hashes index
    files at download: readers in this process need not hash them again)."""
    st = os.stat(path)
    _DIGESTS[(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)] = value


def check(out: Path, name: str, got: str) -> None:
    """IndexFileError naming `out/name` when its sha256 `got` is not what checksums.json records."""
    if recorded(out, (name,))[name] != got:
        raise IndexFileError(Path(out) / name, f"sha256 differs from {CHECKSUMS_NAME}: the file was changed after "
                                               f"the conversion wrote it (`datakit verify {out}` says more)")


def check_same_conversion(where: str | Path, now: dict[str, str] | None, opened: dict[str, str]) -> None:
    """IndexFileError naming `where` (a checksums.json) unless `now`, the identity it records today
    (None: it is gone), is the one a reader `opened`: the dataset was rewritten under the reader."""
    if now is None:
        raise IndexFileError(where, "gone since this reader opened the dataset: it is being rewritten "
                                    "(convert --force?); open it again once that conversion has finished")
    if now != opened:
        raise IndexFileError(where, "changed since this reader opened the dataset: another conversion was "
                                    "written there; open it again to read the new one")

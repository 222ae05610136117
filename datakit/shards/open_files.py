"""The open shard files of one output folder, per process: a bounded LRU of descriptors (and, for
byte-array access, read-only memory maps), each checked against the index when opened.

Used by both readers, `datakit.reader.ShardReader` (memory maps) and the loader's
`loader/reads.py` (`preadv` on descriptors), so both bound their open files the same way.

Why bounded: a DROID-sized folder has thousands of shards and the default soft limit on open
files is 1024; a reader that keeps every shard it touched open fails with EMFILE after a
while. At most `max_open` shards are open at once; the least recently used one is closed when
another is needed (its memory map goes when the last view into it does).

Checks on open ("verify"):
- "size" (default, free): the file exists and has the size the index records. It cannot see
  damage that keeps the size: bytes flipped or overwritten in place (bit rot, a bad copy,
  an edit). Frames read from such a shard are silently wrong.
- "sha256": additionally hash the whole shard once per process and compare with the index,
  before the first byte is used. It costs one full read of every shard touched; a shard that
  is evicted and reopened is size-checked again but not re-hashed. Forked workers inherit
  the set of shards already hashed. `datakit verify` checks everything, offline.
- always: OUT is still the conversion the index came from. The conversion's identity (the
  digests in checksums.json, `index.conversion_id`) is read when this object is made, right
  after the caller loaded and checked the index, and compared again after each shard is
  opened. A rewrite (`convert OTHER OUT --force`) removes checksums.json before any shard is
  replaced, so a shard opened while the old checksums.json is still there is the old one;
  afterwards the open fails with IndexFileError naming checksums.json (gone, or another
  conversion's). Shards opened before the rewrite keep their old inodes and stay consistent.

Remote shard roots: with `cache` (a `storage.cache.ShardCache`; `ShardSource` below names only
what is called here, so the shards room does not import storage), descriptors come from the
node-local download cache instead of `os.open` on a local path; the LRU, the size check and the
error handling stay the same. The cache downloads a shard when it is not there (whole,
size-checked, hashed at download with its verify="sha256", and checked against the remote
checksums.json after the download). With verify="sha256" a cached shard is hashed here on
its first use in this process unless this process hashed that very file at download; a
damaged cached copy is dropped from the cache and downloaded again once.
A descriptor (and a memory map) keeps an evicted shard's disk space in use until it is closed;
the cache counts such shards against its limit until then, so each time a new shard is opened
(and whenever the cache waits for room in this process) the shards the cache has evicted
meanwhile are closed; the limit then holds on disk, not only in the folder listing. When the
cache cannot hold the whole root, one shard is open at a time: a reader that sits idle (a
loader worker between batches) then pins at most one shard, so a cache of (readers) x (largest
shard) plus the download window never waits on idle readers. Reopening a cached shard costs a
few system calls (no hash: `_hashed` is kept).
"""
from __future__ import annotations

import errno
import mmap
import os
import resource
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from datakit.durable import check_size, fd_sha256
from datakit.errors import IndexFileError, ResourceLimitError, ShardError
from datakit.shards import checksums
from datakit.shards.index import ShardEntry, conversion_id
from datakit.shards.names import CHECKSUMS_NAME

VERIFY_MODES = ("size", "sha256")
DEFAULT_MAX_OPEN = 64  # shards open at once per process (each costs 1-2 descriptors)


class ShardSource(Protocol):
    """Where the descriptors of a remote root's shards come from (`storage.cache.ShardCache`)."""

    root_url: str
    max_bytes: int

    def open(self, entry: ShardEntry) -> int: ...  # a checked, whole local copy (downloaded if needed)
    def is_evicted(self, entry: ShardEntry, fd: int) -> bool: ...
    def hashed_here(self, fd: int) -> bool: ...
    def discard(self, entry: ShardEntry, fd: int) -> Path: ...
    def on_evicted(self, release: Callable[[], None]) -> None: ...


@dataclass
class _OpenShard:
    fd: int
    data: np.ndarray | None = None  # read-only uint8 view of an mmap, made on first use


class OpenShards:
    """Lazily opened, checked, read-only shards; at most `max_open` open at a time."""

    def __init__(self, root: Path, shards: list[ShardEntry], *, verify: str = "size",
                 max_open: int = DEFAULT_MAX_OPEN, cache: ShardSource | None = None):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify={verify!r} is not one of {', '.join(VERIFY_MODES)}")
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.root, self.shards, self.verify, self.max_open = Path(root), shards, verify, max_open
        self.cache = cache  # remote root: descriptors come from this download cache
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._hashed: set[int] = set()  # shards whose sha256 matched, in this process or its parent
        self._pid = os.getpid()
        self.identity = conversion_id(self.root)  # the conversion the caller's index belongs to
        if cache is not None:
            cache.on_evicted(self._close_evicted)  # called while the cache waits for room
            if sum(s.bytes for s in shards) > cache.max_bytes:
                self.max_open = 1  # a cache that evicts: an idle reader may pin one shard, not max_open

    def path(self, shard: int) -> str | Path:
        """What errors call the shard: its local path, or its URL on a remote root."""
        if self.cache is not None:
            return f"{self.cache.root_url.rstrip('/')}/{self.shards[shard].name}"
        return self.root / self.shards[shard].name

    def fd(self, shard: int) -> int:
        """A read-only descriptor of the shard (do not close it; the cache does)."""
        return self._get(shard).fd

    def bytes(self, shard: int) -> np.ndarray:
        """The whole shard as a read-only uint8 array over a memory map."""
        entry = self._get(shard)
        if entry.data is None:
            size = self.shards[shard].bytes
            try:
                m = mmap.mmap(entry.fd, size, prot=mmap.PROT_READ) if size else b""
            except OSError as e:
                raise self._os_error(self.path(shard), e, "cannot map") from None
            entry.data = np.frombuffer(m, dtype=np.uint8)
        return entry.data

    @property
    def num_open(self) -> int:
        return len(self._open)

    def _get(self, shard: int) -> _OpenShard:
        if self._pid != os.getpid():  # forked: the parent's descriptors are copies we do not track
            self._forget_inherited()
        entry = self._open.get(shard)
        if entry is not None:
            self._open.move_to_end(shard)
            return entry
        while len(self._open) >= self.max_open:
            _, old = self._open.popitem(last=False)
            os.close(old.fd)  # an mmap holds its own descriptor until its last view is gone
        if self.cache is not None:
            self._close_evicted()  # before asking the cache for room: it counts them until closed
        entry = _OpenShard(self._open_checked(shard))
        if self.cache is not None:
            self._close_evicted()
        self._open[shard] = entry
        return entry

    def _close_evicted(self) -> None:
        """Close the open shards that the download cache has evicted (reopening fetches them
        again); a memory map's last view releases it too."""
        if self._pid != os.getpid():
            return
        for k in [k for k, e in self._open.items() if self.cache.is_evicted(self.shards[k], e.fd)]:
            os.close(self._open.pop(k).fd)

    def _open_checked(self, shard: int, refetched: bool = False) -> int:
        entry, path = self.shards[shard], self.path(shard)
        try:
            if self.cache is not None:
                fd = self.cache.open(entry)  # downloaded when needed; StorageError when it cannot be
                if self.cache.hashed_here(fd):
                    self._hashed.add(shard)  # this very file was hashed at download, in this process
            else:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise ShardError(path, "missing shard file") from None
        except OSError as e:
            raise self._os_error(path, e, "cannot open") from None
        try:
            self._check_same_conversion()  # after the open: see the module docstring
            check_size(path, os.fstat(fd).st_size, entry.bytes)
            digest = fd_sha256(fd) if self.verify == "sha256" and shard not in self._hashed else entry.sha256
        except BaseException:
            os.close(fd)
            raise
        if digest == entry.sha256:
            if self.verify == "sha256":
                self._hashed.add(shard)
            return fd
        if self.cache is not None and not refetched:  # a damaged cached copy: drop it, download again
            local = self.cache.discard(entry, fd)
            os.close(fd)
            warnings.warn(f"{local}: cached copy damaged (sha256 differs from the index); downloading it again",
                          stacklevel=2)
            return self._open_checked(shard, refetched=True)
        os.close(fd)
        raise ShardError(path, f"sha256 {digest[:12]}... differs from the index ({entry.sha256[:12]}...): "
                               "the shard was modified")

    def _check_same_conversion(self) -> None:
        """IndexFileError naming checksums.json when OUT no longer holds the conversion this
        reader opened (rewritten, or being rewritten, under it)."""
        where = (f"{self.cache.root_url.rstrip('/')}/{CHECKSUMS_NAME}" if self.cache is not None
                 else self.root / CHECKSUMS_NAME)
        try:
            now = conversion_id(self.root)
        except IndexFileError:
            now = None
        checksums.check_same_conversion(where, now, self.identity)

    def _os_error(self, path: str | Path, e: OSError, what: str) -> Exception:
        if e.errno == errno.EMFILE:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            return ResourceLimitError(f"{path}: too many open files (limit {soft}); lower max_open_shards "
                                      f"(now {self.max_open}) or raise the limit (`ulimit -n`)")
        return ShardError(path, f"{what} ({e.strerror or e})")

    def _forget_inherited(self) -> None:
        for entry in self._open.values():
            try:
                os.close(entry.fd)  # our copy only; the parent's stays open
            except OSError:
                pass
        self._open, self._pid = OrderedDict(), os.getpid()

    def close(self) -> None:
        """Close every open descriptor (memory maps go when their last view does)."""
        if self._pid == os.getpid():
            for entry in self._open.values():
                os.close(entry.fd)
        self._open = OrderedDict()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"], state["_pid"] = OrderedDict(), -1  # descriptors do not travel
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

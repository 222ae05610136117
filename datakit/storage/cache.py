"""A node-local cache of a remote shard root: whole shards, a size limit, LRU eviction, shared
safely by every rank (process) on the node.

    cache = ShardCache("s3://bucket/droid-224", "/local/nvme/datakit-cache", max_bytes=200 << 30)
    cache.download_ahead(shard_ids_in_read_order)      # background downloads ahead of the sampler
    fd = cache.open(cache.index.shards[k])       # or cache.local_path(entry) -> Path

The downloads ahead (one thread, a bytes window ahead of the reader, protected from eviction)
are `download_ahead.DownloadAhead`; this module is the cache: what is on disk, and how a shard
gets there.

On disk: `cache_dir/<root key>/<index sha256[:16]>/` mirrors the remote root (index.json,
frames.arrow, checksums.json, shard-*.tar), so `load_index` / `load_frames` read it as they
read any converted folder (a feature folder of `datakit encode`, with the same index file names,
is cached the same way and read by `load_features` / `load_clips`). A new conversion at the same
URL gets a new folder; the old one is removed. Index files are pinned and not counted in `max_bytes`; shards are.

Commit protocol, per shard: take the shard's lock (fcntl.flock on `.locks/<name>`), delete any
temp file of that shard (its writer is dead: it no longer holds the lock), make room under the
folder lock, download to `<name>.<pid>.tmp`, check its size (and sha256 with verify="sha256"),
check that the remote checksums.json still names the conversion this cache opened (a rewrite
removes it before any shard, so a changed root fails with IndexFileError instead of caching
another conversion's shard), fsync, rename to `<name>`. A final name is therefore always a
whole, checked shard; a download killed mid-way leaves only a temp file that the next user
cleans. Index files are read by `load_index` / `load_frames`, which compare them with
checksums.json like any reader's.

The limit holds on disk (`cache_disk`): downloads in flight count at full size, and an evicted
shard that a reader still holds open (readers hold a shared flock on what they opened) counts
until its last holder closes it; readers close evicted shards whenever they open another, or
while their process waits for room. A reader that finds no room waits for it (ROOM_WAIT_S),
then fails with ResourceLimitError naming the limit; the download thread just waits. A local
disk that fills up during a download fails at once, naming the local file and disk (`transfer`).

Sizing: `max_bytes` must hold at least (processes reading at once + 1) x (largest shard) plus
the download window; `datakit plan` prints the working set of an epoch.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from datakit.durable import fd_sha256, file_sha256, fsync_dir, write_atomic
from datakit.errors import ResourceLimitError, ShardError, StorageError
from datakit.shards import checksums
from datakit.shards.index import ShardEntry, load_index
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME
from datakit.storage import cache_disk
from datakit.storage.cache_disk import FOLDER_LOCK, LOCKS, flock
from datakit.storage.download_ahead import DownloadAhead
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy, with_retries
from datakit.storage.transfer import download, temp_name
from datakit.storage.urls import deadline, filesystem, join, resolve

ROOM_WAIT_S = 120.0  # how long a reader waits for room before saying cache_bytes is too small
ROOM_POLL_S = 0.02


def _manifest(folder: Path) -> Any:
    """The checked manifest of a cached root: a frame folder's `ShardIndex`, or a feature folder's
    (`datakit encode`) `FeatureIndex`; the cache reads only its shard list."""
    from datakit.shards.features import is_feature_folder, load_features  # torch: imported by a loader anyway

    return load_features(folder) if is_feature_folder(folder) else load_index(folder)


def root_key(url: str) -> str:
    """A readable, collision-free folder name for a root URL."""
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rstrip("/").split("/")[-1])[:40]
    return f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


class ShardCache:
    """Whole-shard cache of one remote shard root in a local folder (see the module docstring)."""

    def __init__(self, root_url: str, cache_dir: str | Path, max_bytes: int, verify: str = "size",
                 storage_options: dict[str, Any] | None = None, policy: RetryPolicy = DEFAULT_RETRY,
                 ahead_bytes: int | None = None):
        if verify not in ("size", "sha256"):
            raise ValueError(f"verify={verify!r} is not one of size, sha256")
        self.root_url, self.max_bytes, self.verify = resolve(root_url), int(max_bytes), verify
        self.storage_options, self.policy = storage_options, policy
        self.base = Path(cache_dir) / root_key(self.root_url)
        self.base.mkdir(parents=True, exist_ok=True)
        self.folder = self._fetch_index()
        (self.folder / LOCKS).mkdir(exist_ok=True)
        self.index = _manifest(self.folder)  # checked against checksums.json, as every reader does
        self._id = {s.name: i for i, s in enumerate(self.index.shards)}
        self._sizes = {s.name: s.bytes for s in self.index.shards}
        largest = max((s.bytes for s in self.index.shards), default=0)
        if largest > self.max_bytes:
            raise ValueError(f"cache max_bytes={self.max_bytes} is smaller than the largest shard of "
                             f"{self.root_url} ({largest} bytes)")
        # downloads ahead keep at most this many bytes of upcoming shards (the rest is for readers)
        self.ahead_bytes = max(largest, self.max_bytes // 2 if ahead_bytes is None else int(ahead_bytes))
        self._init_thread_state()

    # --- index files -------------------------------------------------------------------------
    def _fetch_index(self) -> Path:
        """The local folder of the current remote index (index files fetched and checked once)."""
        url = join(self.root_url, CHECKSUMS_NAME)
        text = self._remote_checksums()
        self.identity = checksums.parse(text, url, (MANIFEST_NAME, FRAMES_NAME))
        sums = self.identity
        folder = self.base / sums[MANIFEST_NAME][:16]
        with flock(self.base / FOLDER_LOCK):
            with contextlib.suppress(FileNotFoundError):
                if (folder / CHECKSUMS_NAME).read_bytes() == text:
                    return folder
            for old in self.base.iterdir():  # an earlier conversion at this URL: its shards are stale
                if old.is_dir() and old != folder:
                    shutil.rmtree(old, ignore_errors=True)
            folder.mkdir(exist_ok=True)
            for name in (FRAMES_NAME, MANIFEST_NAME):
                download(join(self.root_url, name), folder / name, storage_options=self.storage_options,
                         policy=self.policy)
                if file_sha256(folder / name) != sums[name]:
                    raise StorageError(join(self.root_url, name), f"sha256 differs from {CHECKSUMS_NAME} "
                                       "(the root is being rewritten?)")
                checksums.remember(folder / name, sums[name])
            write_atomic(folder / CHECKSUMS_NAME, text)  # last: the folder is complete
        return folder

    def _remote_checksums(self) -> bytes:
        url = join(self.root_url, CHECKSUMS_NAME)
        fs, rpath = filesystem(url, self.storage_options, self.policy)
        try:
            return with_retries(lambda: fs.cat_file(rpath, **deadline(fs, self.policy)), url, "read", self.policy)
        except FileNotFoundError:
            raise StorageError(self.root_url, f"not a finished conversion (no {CHECKSUMS_NAME}), or one being "
                                              "rewritten") from None

    def _check_remote_unchanged(self) -> None:
        """After a shard download: the remote root still holds the conversion this cache opened
        (a rewrite removes checksums.json before any shard, so the shard just read is its own)."""
        url = join(self.root_url, CHECKSUMS_NAME)
        try:
            now = checksums.parse(self._remote_checksums(), url, (MANIFEST_NAME, FRAMES_NAME))
        except StorageError:
            now = None
        checksums.check_same_conversion(url, now, self.identity)

    # --- shards --------------------------------------------------------------------------------
    def local_path(self, entry: ShardEntry) -> Path:
        """Path of the whole, checked shard in the cache, downloading it first when needed.
        The file may be evicted by another process later; `open` returns a descriptor instead."""
        self._consumed(entry)
        return self._ensure(entry)

    def open(self, entry: ShardEntry) -> int:
        """A read-only descriptor of the cached shard, holding a shared lock on it (and so do the
        memory maps made from it) until it is closed: an evicted shard's bytes are counted until
        then. Close it when it is evicted (`is_evicted`), so that its disk space comes back."""
        for _ in range(3):
            path = self.local_path(entry)
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:  # evicted between the check and the open: fetch again
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)  # blocks only while an evictor tests this very file
            if os.fstat(fd).st_size == entry.bytes and not self.is_evicted(entry, fd):
                return fd
            os.close(fd)
        raise ShardError(self.folder / entry.name, "kept disappearing from the cache: max_bytes too small "
                                                   "for the processes sharing it?")

    def on_evicted(self, release: Callable[[], None]) -> None:
        """Register a reader's "close the evicted shards you hold" (`OpenShards`), called while
        this process waits for room."""
        self._release_hooks.append(weakref.WeakMethod(release))

    def _release_evicted(self) -> None:
        for hook in self._release_hooks:
            if (release := hook()) is not None:
                release()

    def is_evicted(self, entry: ShardEntry, fd: int) -> bool:
        """`fd` (from `open`) reads a copy of `entry` that is no longer the cache's."""
        held = os.fstat(fd)
        try:
            now = os.stat(self.folder / entry.name)
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def cached_bytes(self) -> int:
        """Bytes of shards on disk in the cache folder now: whole, in flight, and evicted ones
        that readers still hold open."""
        return cache_disk.used_bytes(self.folder, self._sizes)

    def _ensure(self, entry: ShardEntry, wanted: bool = True) -> Path | None:
        """The whole, checked shard's path, downloaded when needed. `wanted` (a reader needs it):
        wait up to ROOM_WAIT_S for room, then ResourceLimitError. Prefetch (not wanted): None
        when there is no room now."""
        path = self.folder / entry.name
        if self._usable(path, entry):
            return path
        with flock(self.folder / LOCKS / entry.name):
            if self._usable(path, entry):  # another process fetched it while we waited
                return path
            for stale in self.folder.glob(f"{entry.name}.*.tmp"):  # its writer died: we hold the lock
                stale.unlink(missing_ok=True)
            give_up = time.monotonic() + ROOM_WAIT_S
            while True:
                with flock(self.folder / FOLDER_LOCK):
                    short = cache_disk.make_room(self.folder, self._sizes, entry.name, self.max_bytes, self._protected,
                                                  evict_window=wanted)
                    if not short:
                        tmp = temp_name(path)
                        tmp.touch()  # from here on the folder lock's holders count it at its full size
                        break
                if not wanted:
                    return None
                self._release_evicted()  # this process's own readers first: it may be the one holding them
                if time.monotonic() > give_up:
                    raise ResourceLimitError(
                        f"{self.folder}: cache_bytes={self.max_bytes} cannot hold {entry.name} ({entry.bytes} bytes): "
                        f"{short} bytes more are in use (shards being downloaded, or evicted but still open in "
                        f"readers) after {ROOM_WAIT_S:.0f} s; raise cache_bytes to at least (processes reading at "
                        "once + 1) x the largest shard")
                time.sleep(ROOM_POLL_S)  # readers close evicted shards when they open their next one
            try:
                with open(tmp, "r+b") as f:
                    download(join(self.root_url, entry.name), path, expected_size=entry.bytes,
                             storage_options=self.storage_options, policy=self.policy, into=f)
                    if self.verify == "sha256":
                        if (digest := fd_sha256(f.fileno())) != entry.sha256:
                            raise ShardError(join(self.root_url, entry.name),
                                             f"sha256 {digest[:12]}... differs from the index ({entry.sha256[:12]}...)")
                        st = os.fstat(f.fileno())
                        self._hashed_inodes.add((st.st_dev, st.st_ino))
                self._check_remote_unchanged()
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            fsync_dir(self.folder)
        return path

    def hashed_here(self, fd: int) -> bool:
        """The file behind `fd` was hashed against the index by this process (or its parent before
        a fork) when it downloaded it, and renamed into the cache only then."""
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino) in self._hashed_inodes

    def discard(self, entry: ShardEntry, fd: int) -> Path:
        """Evict the cached copy of `entry` that `fd` reads (found damaged), so the next open
        downloads it again; a copy another process has meanwhile replaced is left alone."""
        path = self.folder / entry.name
        with flock(self.folder / LOCKS / entry.name), flock(self.folder / FOLDER_LOCK):
            if not self.is_evicted(entry, fd):
                cache_disk.evict(self.folder, entry.name)
        return path

    def _usable(self, path: Path, entry: ShardEntry) -> bool:
        """A whole shard is under its final name (renamed only after the checks): touch it (LRU)."""
        try:
            if path.stat().st_size != entry.bytes:
                path.unlink(missing_ok=True)  # replaced behind our back: fetch again
                return False
            os.utime(path)
            return True
        except FileNotFoundError:
            return False

    # --- downloads ahead of the reader (download_ahead.py) ------------------------------------
    def _init_thread_state(self) -> None:
        self._pid = os.getpid()
        self._ahead = DownloadAhead([s.bytes for s in self.index.shards], self._prefetch, self.ahead_bytes)
        self._hashed_inodes: set[tuple[int, int]] = set()  # (st_dev, st_ino) of shards hashed at download
        self._release_hooks: list[weakref.WeakMethod] = []  # readers' "close your evicted shards"

    def _prefetch(self, sid: int) -> Path | None:
        return self._ensure(self.index.shards[sid], wanted=False)

    @property
    def _protected(self) -> set[str]:
        """Names of the shards in the download window: evicted last."""
        return {self.index.shards[s].name for s in self._ahead.protected}

    @property
    def download_errors(self) -> list[BaseException]:
        """Errors of downloads ahead (each raised again by the reader's own open of that shard)."""
        return self._ahead.errors

    def download_ahead(self, shard_ids_in_order: Sequence[int]) -> None:
        """Download shards on a background thread in the order the sampler will read them
        (repeats allowed; `download_ahead.shard_sequence`), staying at most `ahead_bytes` ahead of
        the reader. Reader progress is learnt from `local_path`/`open` calls, or from `reader_at`.
        A new call replaces the previous order."""
        if self._pid != os.getpid():  # forked: the parent's thread is not ours
            self._init_thread_state()
        self._ahead.start(shard_ids_in_order)

    def reader_at(self, position: int) -> None:
        """The reader has reached `position` of the current download order. The loader says so per
        batch, because reads in DataLoader workers are not seen by this process; once called,
        opens no longer move the position (a batch opens its shards in file order, not download order)."""
        self._ahead.reader_at(position)

    def close(self) -> None:
        """Stop the download thread (downloads in flight finish or are cleaned by the next user)."""
        self._ahead.close()

    def _consumed(self, entry: ShardEntry) -> None:
        """The reader is at `entry`: move the order position to its next occurrence."""
        sid = self._id.get(entry.name)
        if self._pid == os.getpid() and sid is not None:
            self._ahead.consumed(sid)

    # --- pickling (DataLoader workers): no thread, no locks -------------------------------
    def __getstate__(self) -> dict[str, Any]:
        keep = ("root_url", "max_bytes", "verify", "storage_options", "policy", "base", "folder", "index",
                "_id", "_sizes", "ahead_bytes", "identity")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_thread_state()

"""Publishing a finished local conversion to its remote OUT, in commit order, resumably.

Order: any index file an interrupted earlier publish left remotely (index.json, frames.arrow
without checksums.json) is deleted first; then every shard the index names; then, once each is
present remotely with its size, frames.arrow, index.json and checksums.json (the "finished"
marker) last; then remote shard files the index does not name (an all-skipped shard, or a
longer earlier conversion's) are removed. A reader never sees an index naming a shard not there.

While the conversion runs, `ShardStreamer` uploads each shard as soon as it is committed (its
journal, written after the fsync and rename, is the signal), overlapping the network with
decoding; `publish` then finds those shards in the record and uploads only the rest.

A rerun skips a shard only when this machine's upload record (a JSON file next to the local
staging folder, written after each upload's size check) says the object at that URL was
uploaded from a file with the sha256 the index names, and the object still has its size. A
remote object of the right size but of unknown origin is uploaded again, never trusted.
"""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from datakit.durable import write_atomic
from datakit.errors import ShardError, StorageError
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, INDEX_FILES, JOURNAL_GLOB, MANIFEST_NAME, STAGING
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy, with_retries
from datakit.storage.transfer import remote_size, upload
from datakit.storage.urls import filesystem, join

_SHARD = re.compile(r"^shard-\d+\.tar$")


def _load_record(path: Path, url: str) -> dict[str, str]:
    """{shard name: sha256 uploaded} for `url` (empty when absent, unreadable or for another URL)."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        return {}
    if not isinstance(d, dict) or d.get("url") != url or not isinstance(d.get("shards"), dict):
        return {}
    return {k: v for k, v in d["shards"].items() if isinstance(k, str) and isinstance(v, str)}


def _save_record(path: Path, url: str, shards: dict[str, str]) -> None:
    write_atomic(path, json.dumps({"url": url, "shards": shards}, sort_keys=True).encode())


def remote_sizes(url: str, *, storage_options: dict[str, Any] | None = None,
                 policy: RetryPolicy = DEFAULT_RETRY) -> dict[str, int]:
    """{name: size} of what is directly under `url` (files, and 'folders' as size 0), from one
    fresh listing; {} when nothing is there."""
    fs, base = filesystem(url, storage_options)
    base = base.rstrip("/")

    def ls() -> dict[str, int]:
        fs.invalidate_cache()
        try:
            entries = fs.ls(base, detail=True)
        except FileNotFoundError:
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
                for e in entries if e["name"].rstrip("/") != base}

    return with_retries(ls, url, "listing", policy)


def remote_names(url: str, *, storage_options: dict[str, Any] | None = None,
                 policy: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Names directly under `url` (files and 'folders'), [] when nothing is there."""
    return sorted(remote_sizes(url, storage_options=storage_options, policy=policy))


def remove_remote(url: str, names: list[str], *, storage_options: dict[str, Any] | None = None,
                  policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Delete `url/name` for each name, in order (a missing one is fine)."""
    fs, base = filesystem(url, storage_options)
    for name in names:
        path = f"{base.rstrip('/')}/{name}"

        def rm(path: str = path) -> None:
            try:
                fs.rm_file(path)
            except FileNotFoundError:
                pass

        with_retries(rm, join(url, name), "delete", policy)


def _put(local: Path, url: str, opts: dict[str, Any]) -> None:
    """`upload`, with a refusal by the store (no such bucket, no permission) named after `url`."""
    try:
        upload(local, url, **opts)
    except (FileNotFoundError, PermissionError) as e:
        raise StorageError(url, f"upload refused: {e}") from None


def publish(local_out: Path, url: str, record: Path, *, storage_options: dict[str, Any] | None = None,
            policy: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Upload the finished conversion in `local_out` to `url` (see the module docstring);
    returns the names uploaded, in order."""
    local_out = Path(local_out)
    opts = dict(storage_options=storage_options, policy=policy)
    if not (local_out / CHECKSUMS_NAME).exists():
        raise StorageError(str(local_out), "not a finished conversion (no checksums.json); nothing uploaded")
    shards = json.loads((local_out / MANIFEST_NAME).read_text())["shards"]
    present = remote_names(url, **opts)
    if CHECKSUMS_NAME not in present:  # an unfinished remote OUT: no stale index may stay visible
        remove_remote(url, [n for n in (MANIFEST_NAME, FRAMES_NAME) if n in present], **opts)
    done = _load_record(record, url)
    uploaded = []
    for shard in shards:
        name, path, target = shard["name"], local_out / shard["name"], join(url, shard["name"])
        if path.stat().st_size != shard["bytes"]:
            raise ShardError(path, f"{path.stat().st_size} bytes, the index says {shard['bytes']}; nothing of the "
                                   "index was uploaded")
        if done.get(name) == shard["sha256"] and remote_size(target, **opts) == shard["bytes"]:
            continue
        done.pop(name, None)
        _save_record(record, url, done)  # before the upload: a killed upload is not taken for done
        _put(path, target, opts)  # checks the remote size afterwards
        done[name] = shard["sha256"]
        _save_record(record, url, done)
        uploaded.append(name)
    for shard in shards:  # the contract: the index goes up only over complete shards
        target = join(url, shard["name"])
        if remote_size(target, **opts) != shard["bytes"]:
            raise StorageError(target, "shard missing or of the wrong size after upload; index not uploaded")
    for name in INDEX_FILES:  # upload order; the last = finished
        _put(local_out / name, join(url, name), opts)
        uploaded.append(name)
    named = {s["name"] for s in shards}
    remove_remote(url, [n for n in remote_names(url, **opts) if _SHARD.match(n) and n not in named], **opts)
    return uploaded


class ShardStreamer:
    """Upload the shards a running conversion into `local_out` commits, on a background thread.

    It polls `local_out/.datakit-staging/*.journal` every `interval` seconds; a journal written
    since the streamer started (older ones are an earlier run's, checked and uploaded by
    `publish`) whose shard holds episodes and has the journaled size is uploaded and recorded.
    It touches no engine: any engine that journals its commits is streamed. The first failed
    upload stops the thread quietly; `publish` afterwards uploads whatever is not recorded (and
    raises if the storage still fails)."""

    def __init__(self, local_out: Path, url: str, record: Path, *, interval: float = 0.1,
                 storage_options: dict[str, Any] | None = None, policy: RetryPolicy = DEFAULT_RETRY):
        self.local_out, self.url, self.record, self.interval = Path(local_out), url, record, interval
        self.opts = dict(storage_options=storage_options, policy=policy)
        self.uploaded: list[str] = []
        self.error: BaseException | None = None
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._since = 0.0
        self._thread = threading.Thread(target=self._run, name="shard-stream", daemon=True)

    def __enter__(self) -> ShardStreamer:
        self._since = time.time() - 1e-3
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _committed(self) -> list[tuple[str, str]]:
        """(shard name, sha256) of shards journaled by this run and not handled yet."""
        found = []
        for journal in sorted((self.local_out / STAGING).glob(JOURNAL_GLOB)):
            try:
                if journal.name in self._seen or journal.stat().st_mtime < self._since:
                    continue
                d = json.loads(journal.read_text())
                name, sha, size, placed = d["name"], d["sha256"], d["bytes"], d["placed"]
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                continue
            self._seen.add(journal.name)
            path = self.local_out / str(name)
            if isinstance(name, str) and _SHARD.match(name) and placed and path.is_file() and \
                    path.stat().st_size == size:
                found.append((name, sha))
        return found

    def _run(self) -> None:
        while not self._stop.wait(self.interval):  # what is left at the stop, publish uploads
            if not self._step():
                return

    def _step(self) -> bool:
        try:
            for name, sha in self._committed():
                done = _load_record(self.record, self.url)
                done.pop(name, None)
                _save_record(self.record, self.url, done)
                upload(self.local_out / name, join(self.url, name), **self.opts)
                done[name] = sha
                _save_record(self.record, self.url, done)
                self.uploaded.append(name)
        except Exception as e:  # noqa: BLE001 - publish uploads what is not recorded, or raises
            self.error = e
            return False
        return True

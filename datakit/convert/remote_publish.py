"""Publishing a finished local conversion to its remote OUT, in commit order, resumably.

Order: any index file an interrupted earlier publish left remotely (index.json, frames.arrow
without checksums.json) is deleted first; then every shard the index names; then, once each is
present remotely with its size, frames.arrow, index.json and checksums.json (the "finished"
marker) last; then remote shard files the index does not name (an all-skipped shard, or a
longer earlier conversion's) are removed. A reader never sees an index naming a shard not there.

A rerun skips a shard only when this machine's upload record (a JSON file next to the local
staging folder, written after each upload's size check) says the object at that URL was
uploaded from a file with the sha256 the index names, and the object still has its size. A
remote object of the right size but of unknown origin is uploaded again, never trusted.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from datakit.durable import write_atomic
from datakit.errors import ShardError, StorageError
from datakit.shards.index import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy, with_retries
from datakit.storage.transfer import remote_size, upload
from datakit.storage.urls import filesystem, join

INDEX_ORDER = (FRAMES_NAME, MANIFEST_NAME, CHECKSUMS_NAME)  # upload order; the last = finished
_SHARD = re.compile(r"^shard-\d+\.tar$")


def _load_record(path: Path, url: str) -> dict[str, str]:
    """{shard name: sha256 uploaded} for `url` (empty when absent, unreadable or for another URL)."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(d, dict) or d.get("url") != url or not isinstance(d.get("shards"), dict):
        return {}
    return {k: v for k, v in d["shards"].items() if isinstance(k, str) and isinstance(v, str)}


def _save_record(path: Path, url: str, shards: dict[str, str]) -> None:
    write_atomic(path, json.dumps({"url": url, "shards": shards}, sort_keys=True).encode())


def remote_names(url: str, *, storage_options: dict[str, Any] | None = None,
                 policy: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Names directly under `url` (files and 'folders'), [] when nothing is there."""
    fs, base = filesystem(url, storage_options)
    base = base.rstrip("/")

    def ls() -> list[str]:
        fs.invalidate_cache()
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False) if p.rstrip("/") != base)
        except FileNotFoundError:
            return []

    return with_retries(ls, url, "listing", policy)


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
        upload(path, target, **opts)  # checks the remote size afterwards
        done[name] = shard["sha256"]
        _save_record(record, url, done)
        uploaded.append(name)
    for shard in shards:  # the contract: the index goes up only over complete shards
        target = join(url, shard["name"])
        if remote_size(target, **opts) != shard["bytes"]:
            raise StorageError(target, "shard missing or of the wrong size after upload; index not uploaded")
    for name in INDEX_ORDER:
        upload(local_out / name, join(url, name), **opts)
        uploaded.append(name)
    named = {s["name"] for s in shards}
    remove_remote(url, [n for n in remote_names(url, **opts) if _SHARD.match(n) and n not in named], **opts)
    return uploaded

"""A shard root that may live on object storage: where readers find its index files, and the
download cache (`cache.ShardCache`) its shards come from.

    folder, cache = open_root("s3://bucket/droid-224", verify="size", cache_dir=None, cache_bytes=0)
    index = load_index(folder)                 # the cache folder mirrors the remote root
    files = OpenShards(folder, index.shards, cache=cache)

Used by the loader (`ShardDataset`), `ShardReader` / `open_shards`, so a remote root is read
the same way everywhere. A shard root is remote only when it is written as a URL (`s3://...`,
`gs://...`); `file://x` and plain paths are local folders (a relative path that does not exist
is not taken for a Hub repo id here: shards are read from folders or buckets, not from the Hub).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from datakit.storage.cache import ShardCache
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy
from datakit.storage.urls import resolve, scheme

CACHE_ENV = "DATAKIT_CACHE"  # overrides the default cache folder (e.g. a node-local NVMe)
DEFAULT_CACHE_SHARE = 0.5  # cache_bytes=0: this share of the cache disk's free space at start


def remote_url(root: str | Path) -> str | None:
    """The canonical URL of a remote shard root, None for a local folder (`file://x` is local).
    A URL mangled by pathlib (`s3:/bucket`) raises ValueError saying so."""
    text = str(root)
    url = resolve(text) if scheme(text) is not None or ":/" in text else text
    return url if scheme(text) is not None and scheme(url) is not None else None


def default_cache_dir() -> Path:
    """$DATAKIT_CACHE, else $XDG_CACHE_HOME/datakit/shards, else ~/.cache/datakit/shards."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "datakit" / "shards"


def cache_size(cache_dir: Path, cache_bytes: int) -> int:
    """`cache_bytes`, or with 0 half of the free space of the disk holding `cache_dir`."""
    if cache_bytes:
        return int(cache_bytes)
    cache_dir.mkdir(parents=True, exist_ok=True)
    return int(shutil.disk_usage(cache_dir).free * DEFAULT_CACHE_SHARE)


def open_root(root: str | Path, *, verify: str = "size", cache_dir: str | Path | None = None, cache_bytes: int = 0,
              storage_options: dict[str, Any] | None = None,
              policy: RetryPolicy | None = None) -> tuple[Path, ShardCache | None]:
    """(local folder holding index.json and frames.arrow, download cache or None) of a shard root.

    A local root is returned as it is, with no cache. A remote one gets a `ShardCache` in
    `cache_dir` (default: `default_cache_dir()`), limited to `cache_bytes` (0: half the free
    space there), checking shards by size or, with verify="sha256", by hash at download.
    `policy`: retries of every remote call (None: this module's DEFAULT_RETRY, read at call time)."""
    url = remote_url(root)
    if url is None:
        return Path(resolve(str(root)) if scheme(str(root)) == "file" else root), None
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    cache = ShardCache(url, folder, max_bytes=cache_size(folder, cache_bytes), verify=verify,
                       storage_options=storage_options, policy=policy or DEFAULT_RETRY)
    return cache.folder, cache

"""Moving whole files between object storage and local disk, never leaving a half-written one.

- `download(url, dest)`: stream to `dest`'s temporary name, check the size, fsync, rename.
- `fetch(root, names, scratch)`: a source episode's files into a local scratch folder (Hub files
  come from huggingface_hub's own cache, so they are downloaded once per machine and are read
  offline once cached).
- `upload(local, url)`: one finished file; an object store publishes an object only when its
  upload completes, and a local (file://) target gets temp name + rename, so a reader sees the
  whole file or nothing. The remote size is checked afterwards.
- `upload_output(local_out, url)`: a finished conversion folder in commit order: shards, then
  frames.arrow, then index.json, then checksums.json (the "finished" marker) last, so a reader
  never sees an index that names a shard not yet there.
Every remote call is retried with backoff (`retry`), then fails with an error naming the URL.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from datakit.durable import atomic_path, temp_path
from datakit.errors import DatakitError, ResourceLimitError, ShardError, StorageError, output_error
from datakit.shards.names import CHECKSUMS_NAME, INDEX_FILES, MANIFEST_NAME
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy, with_retries
from datakit.storage.urls import deadline, filesystem, join, repo_id_of, resolve, scheme

COPY_CHUNK = 8 << 20  # bytes per read of a remote stream


def temp_name(dest: Path) -> Path:
    """The temporary name a download into `dest` is written under (pid-tagged, never shared)."""
    return temp_path(dest)


class IncompleteDownload(ConnectionError):
    """The stream ended before the expected size: retried like a dropped connection."""


def local_write_error(dest: Path, url: str, e: OSError) -> DatakitError:
    """One line for a download that the local disk refused: the local file and its disk, not
    the remote object (not retried: a full disk stays full)."""
    code = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "no errno"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(dest.parent).free if dest.parent.exists() else 0
        return ResourceLimitError(f"{dest}: the local disk is full ({code}, {free} bytes free on the disk holding "
                                  f"{dest.parent}) while downloading {url}; free space there, or lower cache_bytes")
    return output_error(dest, e)


class _LocalWriteFailed(Exception):
    """Carries an OSError of the local side of a download out of the retry loop."""

    def __init__(self, e: OSError):
        self.error = e


def _stream_to(fs, rpath: str, out, expected: int | None, policy: RetryPolicy) -> int:
    """Copy a remote file into the open binary `out` from its start; returns the bytes copied.
    Each read waits at most the policy's timeout (the filesystem's socket timeout), and the
    whole copy its deadline. A failed local write raises _LocalWriteFailed (not a network error)."""
    end = time.monotonic() + policy.deadline(expected or 0)
    try:
        out.seek(0)
        out.truncate()
    except OSError as e:
        raise _LocalWriteFailed(e) from None
    n = 0
    with fs.open(rpath, "rb", block_size=COPY_CHUNK) as src:
        while chunk := src.read(COPY_CHUNK):
            try:
                out.write(chunk)
            except OSError as e:
                raise _LocalWriteFailed(e) from None
            n += len(chunk)
            if time.monotonic() > end:
                raise TimeoutError(f"{n} bytes after {policy.deadline(expected or 0):.0f} s, slower than "
                                   f"{policy.min_rate:.0f} bytes/s")
    if expected is not None and n != expected:
        raise IncompleteDownload(f"got {n} of {expected} bytes (connection dropped, or the object changed?)")
    return n


def _copy(fs, rpath: str, out, expected: int | None, url: str, dest: Path, policy: RetryPolicy) -> None:
    """`_stream_to` with retries, then flush and fsync; a local write error names `dest`."""
    try:
        with_retries(lambda: _stream_to(fs, rpath, out, expected, policy), url, "download", policy)
    except _LocalWriteFailed as e:
        raise local_write_error(dest, url, e.error) from None
    try:
        out.flush()
        os.fsync(out.fileno())
    except OSError as e:
        raise local_write_error(dest, url, e) from None


def download(url: str, dest: Path, *, expected_size: int | None = None, storage_options: dict[str, Any] | None = None,
             policy: RetryPolicy = DEFAULT_RETRY, into=None) -> Path:
    """Download `url` whole to `dest` (temp name, fsync, rename). `into`: an already open binary
    file to fill instead (the cache passes its locked, preallocated temp file; no rename then)."""
    dest = Path(dest)
    fs, rpath = filesystem(url, storage_options, policy)
    if into is not None:
        _copy(fs, rpath, into, expected_size, url, dest, policy)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(dest) as tmp, open(tmp, "wb") as f:
            _copy(fs, rpath, f, expected_size, url, dest, policy)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # closing the temp file, or its rename
            raise local_write_error(dest, url, e) from None
        raise
    return dest


def fetch(root: str, names: Iterable[str], scratch: Path, *, storage_options: dict[str, Any] | None = None,
          policy: RetryPolicy = DEFAULT_RETRY) -> list[Path]:
    """Local paths of `root/name` for each name: a local root is used in place, a Hub dataset
    is read through huggingface_hub's cache, anything else is downloaded under `scratch/name`
    (kept there when already complete, e.g. after a restart)."""
    root = resolve(root)
    names = list(names)
    if scheme(root) is None:
        return [Path(root) / n for n in names]
    repo = repo_id_of(root)
    if repo is not None:
        return [_hub_file(root, repo, n, policy) for n in names]
    out = []
    for n in names:
        url, dest = join(root, n), Path(scratch) / n
        size = remote_size(url, storage_options=storage_options, policy=policy)
        if size is None:
            raise StorageError(url, "no such file in the source")
        if not (dest.exists() and dest.stat().st_size == size):
            download(url, dest, expected_size=size, storage_options=storage_options, policy=policy)
        out.append(dest)
    return out


def _hub_file(root: str, repo: str, name: str, policy: RetryPolicy) -> Path:
    """One file of a Hub dataset via hf_hub_download: cached once per machine, served offline."""
    from huggingface_hub import constants, hf_hub_download

    sub = root[len("hf://datasets/") + len(repo):].strip("/")
    filename = f"{sub}/{name}" if sub else name
    offline = constants.is_offline_mode()
    try:
        return Path(with_retries(lambda: hf_hub_download(repo, filename, repo_type="dataset",
                                                         local_files_only=offline), repo, f"download of {filename}",
                                 policy))
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - huggingface_hub has many error types; all end here
        why = "this machine is offline (HF_HUB_OFFLINE=1) and the file is not in the Hub cache" if offline else str(e)
        raise StorageError(repo, f"cannot fetch {filename} from the Hugging Face Hub: {why}") from None


def remote_size(url: str, *, storage_options: dict[str, Any] | None = None,
                policy: RetryPolicy = DEFAULT_RETRY) -> int | None:
    """Size of the object at `url`, None when there is none (fresh listing, no stale cache)."""
    fs, rpath = filesystem(url, storage_options, policy)

    def stat() -> int | None:
        fs.invalidate_cache(rpath)
        try:
            return int(fs.info(rpath, **deadline(fs, policy))["size"])
        except FileNotFoundError:
            return None

    return with_retries(stat, url, "stat", policy)


def upload(local: Path, url: str, *, storage_options: dict[str, Any] | None = None,
           policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Upload one finished local file so that `url` holds all of it or nothing; the remote size
    is checked against the local one afterwards."""
    local = Path(local)
    size = local.stat().st_size
    fs, rpath = filesystem(url, storage_options, policy)
    if scheme(resolve(url)) is None:  # local target: temp name + rename, like every local write
        dest = Path(rpath)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest) as tmp, open(local, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_CHUNK)
    else:
        with_retries(lambda: fs.put_file(str(local), rpath, **deadline(fs, policy, size)), url, "upload", policy)
    got = remote_size(url, storage_options=storage_options, policy=policy)
    if got != size:
        raise StorageError(url, f"after upload the object has {got} bytes, the local file {local} has {size}")


def upload_output(local_out: Path, url: str, *, storage_options: dict[str, Any] | None = None,
                  policy: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Upload a finished conversion folder to `url` in commit order; returns the names uploaded.

    Shards already there with the index's size are skipped (a rerun resumes). Every shard the
    index names is checked present remotely with its size before the first index file goes up."""
    local_out = Path(local_out)
    if not (local_out / CHECKSUMS_NAME).exists():
        raise StorageError(str(local_out), "not a finished conversion (no checksums.json); nothing uploaded")
    manifest = json.loads((local_out / MANIFEST_NAME).read_text())
    uploaded = []
    for shard in manifest["shards"]:
        path, target = local_out / shard["name"], join(url, shard["name"])
        if path.stat().st_size != shard["bytes"]:
            raise ShardError(path, f"{path.stat().st_size} bytes, the index says {shard['bytes']}; nothing of the "
                                   "index was uploaded")
        if remote_size(target, storage_options=storage_options, policy=policy) != shard["bytes"]:
            upload(path, target, storage_options=storage_options, policy=policy)
            uploaded.append(shard["name"])
    for shard in manifest["shards"]:  # the contract: the index goes up only over complete shards
        target = join(url, shard["name"])
        if remote_size(target, storage_options=storage_options, policy=policy) != shard["bytes"]:
            raise StorageError(target, "shard missing or of the wrong size after upload; index not uploaded")
    for name in INDEX_FILES:  # upload order; the last = finished
        upload(local_out / name, join(url, name), storage_options=storage_options, policy=policy)
        uploaded.append(name)
    return uploaded

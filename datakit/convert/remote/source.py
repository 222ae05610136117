"""A conversion source on object storage (s3://, gs://, hf://datasets/..., a Hub repo id): its
files fetched into a local scratch folder, from which the converter reads as from any folder.

Every file under the URL is fetched up front (metadata, tables, videos), not episode by
episode: the scanners and decoders read local paths, and fetching per episode would reach into
every engine. A file already in the scratch folder with the remote size and modification time is
kept, so a rerun after a kill fetches only what is missing. Each downloaded file gets the remote
object's modification time, so the source fingerprint (which records video sizes and mtimes) is
the same for every fetch of the same objects: a rerun is recognised as the same source.

Hub datasets are read through huggingface_hub's cache (downloaded once per machine); the scratch
folder then holds symlinks into that cache, named as in the repo. The scratch folder is named
after the URL's last part, so the index records the same source name as a local conversion.
"""
from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from datakit.errors import StorageError
from datakit.storage import transfer
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy, with_retries
from datakit.storage.urls import filesystem, join, repo_id_of, resolve


def _mtime(info: dict[str, Any]) -> float | None:
    """The modification time an fsspec `info` dict carries, as a POSIX timestamp (None: none)."""
    for key in ("LastModified", "mtime", "last_modified", "modified", "created"):
        v = info.get(key)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def list_source(url: str, *, storage_options: dict[str, Any] | None = None,
                policy: RetryPolicy = DEFAULT_RETRY) -> dict[str, tuple[int, float | None]]:
    """{name relative to `url`: (bytes, mtime)} of every file under `url` (a fresh listing).
    An offline or unreachable Hub raises StorageError naming the repo id; no files at all raises naming the URL."""
    fs, base = filesystem(url, storage_options)
    base = base.rstrip("/")

    def find() -> dict[str, Any]:
        fs.invalidate_cache()
        return fs.find(base, detail=True, withdirs=False)

    try:
        found = with_retries(find, url, "listing", policy)
    except FileNotFoundError:
        found = {}
    except StorageError as e:
        repo = repo_id_of(url)
        if repo is None or e.__cause__ is None:
            raise
        cause = f"{type(e.__cause__).__name__}: {str(e.__cause__)[:160]}"
        raise StorageError(repo, f"Hugging Face Hub dataset, but the Hub cannot be reached ({cause}, "
                                 f"{policy.attempts} attempts); check the network, or download it where there is "
                                 "one and pass the local folder") from None
    files = {p[len(base) + 1:]: (int(i.get("size") or 0), _mtime(i)) for p, i in found.items()
             if i.get("type", "file") == "file" and p.startswith(base + "/")}
    if not files:
        raise StorageError(url, "no files there; not a dataset (wrong bucket or prefix?)")
    bad = next((n for n in files if n.startswith("/") or ".." in n.split("/")), None)
    if bad is not None:  # a name that would land outside the scratch folder
        raise StorageError(join(url, bad), "file name leaves the dataset folder; refused")
    return files


def _link(target: Path, link: Path) -> None:
    """`link` -> `target` (replacing a stale link)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        if link.is_symlink() and Path(os.readlink(link)) == target:
            return
        link.unlink()
    os.symlink(target, link)


def fetch_source(src: str, scratch: Path, *, storage_options: dict[str, Any] | None = None,
                 policy: RetryPolicy = DEFAULT_RETRY) -> Path:
    """The local folder (under `scratch`, named after the URL's last part) holding every file of
    the dataset at `src`; see the module docstring."""
    url = resolve(src).rstrip("/")
    folder = Path(scratch) / url.rsplit("/", 1)[-1]
    files = list_source(url, storage_options=storage_options, policy=policy)
    if repo_id_of(url) is not None:  # Hub: huggingface_hub's cache, linked under the repo's names
        names = sorted(files)
        for name, path in zip(names, transfer.fetch(url, names, folder, policy=policy)):
            _link(Path(path).resolve(), folder / name)
        return folder
    for name, (size, mtime) in sorted(files.items()):
        dest = folder / name
        if dest.is_file() and dest.stat().st_size == size and (mtime is None or dest.stat().st_mtime == mtime):
            continue
        transfer.download(join(url, name), dest, expected_size=size, storage_options=storage_options, policy=policy)
        if mtime is not None:
            os.utime(dest, (mtime, mtime))
    return folder

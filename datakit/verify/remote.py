"""`datakit verify s3://bucket/out`: every check of `verify/folder.py` on a remote root, with
bounded local disk.

The index files (checksums.json, index.json, frames.arrow) are downloaded to a scratch folder,
then `folder.check_folder` runs the same checks, in the same order, as on a local folder. Shards
are reached one at a time: the remote object's size is compared with the index before anything
is downloaded (a truncated or missing shard costs one HEAD), then the shard is downloaded whole,
checked (sha256, tar members against the index, state / action bit for bit) and deleted before
the next one. Local disk used: the index files plus the largest shard.

A feature folder (`datakit encode`) gets `verify/features.py`'s checks the same way.

Problems name the remote objects (`s3://bucket/out/shard-000003.tar: sha256 differs ...`),
never the scratch folder. Transient server errors are retried with backoff (`retry`); a server
that keeps failing raises StorageError naming the URL (that is not a verdict on the data).
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datakit.errors import IndexFileError, Problem
from datakit.shards.index import ShardEntry
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy
from datakit.storage.transfer import download, remote_size
from datakit.storage.urls import join
from datakit.shards.features import is_feature_folder
from datakit.verify.features import check_features
from datakit.verify.folder import VerifyReport, check_folder


def verify_remote(url: str, *, storage_options: dict[str, Any] | None = None, scratch: str | Path | None = None,
                  policy: RetryPolicy | None = None) -> VerifyReport:
    """Verify the shard root at `url` (see the module docstring); `scratch`: the local folder
    under which a temporary working folder is made (default: the system's temp folder)."""
    policy = policy or DEFAULT_RETRY
    url = url.rstrip("/")
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="datakit-verify-", dir=scratch) as tmp:
        folder = Path(tmp)

        def shown(text: str) -> str:  # the scratch copy's path -> the remote object's URL
            return text.replace(f"{folder}/", f"{url}/")

        for name in (CHECKSUMS_NAME, MANIFEST_NAME, FRAMES_NAME):
            with contextlib.suppress(FileNotFoundError):  # a missing file is named by the checks
                download(join(url, name), folder / name, storage_options=storage_options, policy=policy)

        @contextlib.contextmanager
        def shard_file(entry: ShardEntry) -> Iterator[tuple[Path, int | None]]:
            path, remote = folder / entry.name, join(url, entry.name)
            size = remote_size(remote, storage_options=storage_options, policy=policy)
            try:
                if size == entry.bytes:  # otherwise the size check names it; nothing to fetch
                    download(remote, path, expected_size=size, storage_options=storage_options, policy=policy)
                yield path, size
            finally:
                path.unlink(missing_ok=True)  # one shard on disk at a time

        try:  # a feature folder (`datakit encode`) gets its own checks, its shards reached the same way
            rep = (check_features if is_feature_folder(folder) else check_folder)(folder, shard_file)
        except IndexFileError as e:
            raise IndexFileError(shown(e.path), shown(e.problem)) from None
        rep.problems = [Problem(shown(p.where), shown(p.what)) for p in rep.problems]
        return rep

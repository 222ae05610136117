"""`datakit verify OUT`: prove the output folder is what the conversion wrote, or name what is not.

    from datakit.verify import verify
    report = verify("out/")            # or "s3://bucket/out"
    report.ok, report.problems         # problems: [Problem(where, what), ...]

folder.py holds every check (`check_folder`, on index files and shards reached one at a time);
remote.py runs the same checks on a remote root with bounded local disk. This file only says
which of the two a root gets.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datakit.durable import file_size
from datakit.storage.roots import remote_url
from datakit.storage.urls import local_path
from datakit.shards.features import is_feature_folder
from datakit.verify.features import check_features
from datakit.verify.folder import VerifyReport, check_folder


def verify(out: str | Path, progress: bool = False, *, storage_options: dict[str, Any] | None = None,
           scratch: str | Path | None = None) -> VerifyReport:
    """Check a converted folder, or a remote root (`s3://...`; see `verify/remote.py`), and list
    every problem found (`report.ok` when none)."""
    url = remote_url(out)
    if url is not None:
        from datakit.verify.remote import verify_remote  # fsspec and the transfer code: only for URLs

        return verify_remote(url, storage_options=storage_options, scratch=scratch)
    out = Path(local_path(out))  # file://x is the folder x
    if is_feature_folder(out):  # `datakit encode`'s output
        return check_features(out, lambda entry: _local_shard(out / entry.name))
    return check_folder(out, lambda entry: _local_shard(out / entry.name))


@contextlib.contextmanager
def _local_shard(path: Path) -> Iterator[tuple[Path, int | None]]:
    yield path, file_size(path)

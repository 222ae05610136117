"""Upload a conversion's shards while it runs, and its index last: the remote-OUT side of
`datakit convert`.

The converter writes every shard locally (temp name, hash, fsync, rename, journal) as it does
for a local OUT, and reports each committed shard here; a background thread uploads them in
the order reported, overlapping the network with decoding. `finish(local_out)` waits for every
upload, checks that each shard the index names is present remotely with its size, then uploads
frames.arrow, index.json and checksums.json, in that order (`transfer.upload_output`, which
skips the shards already there). The first failed upload stops the thread and is raised by the
next `shard_committed` or by `finish`, so no index is ever uploaded over a missing shard.

    up = ShardUploader("s3://bucket/out")
    ... up.shard_committed(out / "shard-000003.tar")   # from the commit callback
    up.finish(out)                                       # after write_index
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy
from datakit.storage.transfer import remote_size, upload, upload_output
from datakit.storage.urls import join

_DONE = object()


class ShardUploader:
    """Background upload of committed shards to `url`, then the index files in commit order."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None, policy: RetryPolicy = DEFAULT_RETRY):
        self.url, self.storage_options, self.policy = url, storage_options, policy
        self.uploaded: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shard-upload", daemon=True)
        self._thread.start()

    def shard_committed(self, path: Path) -> None:
        """Queue one committed (renamed, fsynced, hashed) shard for upload."""
        self._raise_if_failed()
        self._queue.put(Path(path))

    def finish(self, local_out: Path) -> list[str]:
        """Wait for the shard uploads, then upload what is missing and the index files last.
        Returns every name uploaded, in order."""
        self._queue.put(_DONE)
        self._thread.join()
        self._raise_if_failed()
        rest = upload_output(Path(local_out), self.url, storage_options=self.storage_options, policy=self.policy)
        self.uploaded += rest
        return self.uploaded

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._queue.get()) is not _DONE:
            if self._error is not None:
                continue  # drain: after a failure nothing more is uploaded
            target = join(self.url, item.name)
            try:
                size = item.stat().st_size
                if remote_size(target, storage_options=self.storage_options, policy=self.policy) != size:
                    upload(item, target, storage_options=self.storage_options, policy=self.policy)
                    self.uploaded.append(item.name)
            except BaseException as e:  # noqa: BLE001 - handed to the converter's thread
                self._error = e

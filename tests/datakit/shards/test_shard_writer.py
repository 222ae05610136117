"""ShardFile: the bytes and the SHA-256 it reports, with the writes and the hash on its writer
thread, checked against the file itself (hashlib over the bytes on disk) and against the
concatenation of what was written; a writer-thread failure reaches the producer."""
from __future__ import annotations

import errno
import hashlib

import numpy as np
import pytest

from datakit.convert.shard import OutputShard
from datakit.errors import OutputError
from datakit.shards.writer import END_OF_ARCHIVE, ShardFile


def _pieces() -> list:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(20)]
    big = rng.integers(0, 255, 9 << 20, dtype=np.uint8)  # larger than a small queue limit, hashed without the GIL
    return [b"\0" * 512, *(memoryview(f).cast("B") for f in frames), b"tail", memoryview(big)]


def test_hash_and_bytes_equal_hashlib_over_the_file(tmp_path):
    shard = ShardFile(tmp_path / "shard-000000.tar")
    pieces = _pieces()
    for p in pieces:
        shard.write(p)
    nbytes, sha = shard.close()
    data = (tmp_path / "shard-000000.tar").read_bytes()
    assert data == b"".join(bytes(p) for p in pieces) + END_OF_ARCHIVE
    assert nbytes == len(data) and sha == hashlib.sha256(data).hexdigest()


def test_hash_after_a_rollback_is_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr("datakit.shards.writer.QUEUE_BYTES", 1 << 16)  # the producer waits on the writer
    shard = ShardFile(tmp_path / "s.tar")
    pieces = _pieces()
    shard.write(pieces[0])
    keep = shard.bytes
    for p in pieces[1:]:
        shard.write(p)
    shard.truncate(keep)  # an episode that failed half-way
    shard.write(b"after")
    nbytes, sha = shard.close()
    data = (tmp_path / "s.tar").read_bytes()
    assert data == bytes(pieces[0]) + b"after" + END_OF_ARCHIVE
    assert nbytes == len(data) and sha == hashlib.sha256(data).hexdigest()


class _FullDisk:
    """A file object whose writes fail as a full disk does."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_failed_write_on_the_writer_thread_reaches_the_producer(tmp_path):
    shard = OutputShard(tmp_path / "shard-000003.tar")
    shard.f = _FullDisk(shard.f)
    with pytest.raises(OutputError) as info:
        for _ in range(1000):  # write() returns at once; the failure shows at a later call
            shard.write(b"x" * 4096)
        shard.finish()
    assert "shard-000003.tar.tmp" in str(info.value) and "ENOSPC" in str(info.value)
    shard.abort()
    assert not list(tmp_path.iterdir())

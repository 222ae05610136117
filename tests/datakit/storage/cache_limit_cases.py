"""The node-local shard cache honours `cache_bytes` on disk, the download in flight and shards
that readers still hold open included, and a full local disk is named as such (issue 14,
item 11).

The oracle for "on disk" is the kernel's view, sampled while a loader (with and without worker
processes) runs two epochs: every shard file under the cache folder plus every deleted shard
file that some process still holds open (/proc/<pid>/fd), which `du` does not see but the disk
does. Before the fix evicted shards held open by the readers put it about one shard over.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")

from datakit.errors import ResourceLimitError  # noqa: E402
from datakit.loader import LoaderConfig, ShardLoader  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402
from datakit.storage import roots, transfer  # noqa: E402
from datakit.storage.retry import RetryPolicy  # noqa: E402

pytestmark = pytest.mark.timeout(180)
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, jitter=0.0)


def shard_bytes_on_disk(folder: Path) -> int:
    """Bytes of shard files (whole, in flight, evicted) under `folder`, plus deleted ones that any
    process still holds open."""
    held: dict[tuple[int, int], int] = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name.startswith("shard-"):
                try:
                    st = os.stat(os.path.join(root, name))
                except FileNotFoundError:
                    continue
                held[(st.st_dev, st.st_ino)] = st.st_blocks * 512 if name.endswith(".tmp") else st.st_size
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(str(folder)) and target.endswith(" (deleted)"):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    held[(st.st_dev, st.st_ino)] = st.st_size
            except OSError:
                continue
    return sum(held.values())


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_stays_within_cache_bytes_on_disk(converted, uploaded, tmp_path, monkeypatch, workers):
    monkeypatch.setattr(roots, "DEFAULT_RETRY", FAST)
    limit = 2 * max(s.bytes for s in load_index(converted).shards)  # 4 shards: evictions all the time
    cfg = LoaderConfig(batch_size=4, frame_offsets=(-2, 0), action_horizon=3, shuffle="shard_block", block_size=8,
                       seed=3, pin_memory=False, num_workers=workers, cache_dir=str(tmp_path / "c"),
                       cache_bytes=limit)
    loader = ShardLoader(uploaded, cfg)
    folder = loader.dataset.cache.folder
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], shard_bytes_on_disk(folder))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        batches = sum(1 for _ in range(2) for _ in loader)
    finally:
        stop.set()
        sampler.join()
        loader.close()
    assert batches == 2 * loader.sampler.steps_per_epoch
    assert 0 < peak[0] <= limit, f"{peak[0]} bytes of shards on disk, cache_bytes={limit}"


class SmallDisk:
    """A local file on a disk that is full after `room` bytes (what write() does on one)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b) -> int:
        if self.f.tell() + len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_full_local_disk_is_not_retried_and_names_the_local_disk(converted, uploaded, tmp_path):
    slept: list[float] = []
    policy = RetryPolicy(attempts=4, base_delay=0.01, jitter=0.0, sleep=slept.append)
    name = load_index(converted).shards[0].name
    dest = tmp_path / name
    with open(dest, "w+b") as f:
        with pytest.raises(ResourceLimitError) as err:
            transfer.download(f"{uploaded}/{name}", dest, policy=policy, into=SmallDisk(f, room=1000))
    msg = str(err.value)
    assert msg.startswith(f"{dest}: the local disk is full (ENOSPC") and str(tmp_path) in msg, msg
    assert "\n" not in msg and slept == []  # not retried: the disk stays full


def test_a_reader_that_keeps_a_shard_pinned_gets_a_clear_error_not_an_overshoot(converted, uploaded, tmp_path,
                                                                               monkeypatch):
    """Frames from ShardReader are views of the shard's memory map; kept, they pin the shard. With
    room for one shard, the next shard cannot come in: after ROOM_WAIT_S, one line naming the limit."""
    from datakit.reader import open_shards
    from datakit.storage import cache as cache_mod

    monkeypatch.setattr(roots, "DEFAULT_RETRY", FAST)
    monkeypatch.setattr(cache_mod, "ROOM_WAIT_S", 0.3)
    shards = load_index(converted).shards
    limit = max(s.bytes for s in shards)
    r = open_shards(uploaded, cache_dir=tmp_path / "c", cache_bytes=limit)
    kept = r.read_raw(int(r.index.shards[0].rows[0]), r.cameras[0])  # a view into shard 0's map
    with pytest.raises(ResourceLimitError, match=rf"cache_bytes={limit} cannot hold shard-000001.tar") as err:
        r.read_raw(int(r.index.shards[1].rows[0]), r.cameras[0])
    assert "\n" not in str(err.value)
    assert shard_bytes_on_disk(r.files.cache.folder) <= limit
    del kept

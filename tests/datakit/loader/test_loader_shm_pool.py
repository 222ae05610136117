"""Shared-memory ring buffers (`datakit.loader.shm_pool`): reused, never overwritten early, and
with workers the loader gives exactly the batches of the single-process path.

Oracles: the 0-worker loader (no shared memory at all) for whole batches, and plain counting for
the ring (which buffer comes next, when a worker must wait). The lending of buffers to the caller
and the bytes against the shards themselves: test_loader_loans.py.
"""
import os
import shutil
import threading
import time

import pytest
import torch

from datakit.loader import LoaderConfig, ShardLoader
from datakit.loader.shm_pool import BufferPool
from loader_fixtures import shards_rgb  # noqa: F401


def _epochs(loader, n):
    """Host batches of `n` epochs, kept (so a lent buffer must not be refilled while kept)."""
    return [b for _ in range(n) for b in loader]


def _assert_same(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys(), i
        for k in w:
            assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), (i, k)


# --- the ring on its own ----------------------------------------------------------------------
def test_buffers_come_round_robin_and_a_full_ring_waits_for_a_release():
    pool = BufferPool(num_workers=2, buffers=3, buffer_bytes=16)
    assert [pool.acquire(1) for _ in range(3)] == [0, 1, 2]
    assert pool.acquire(0) == 0  # rings are per worker
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(1)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive() and not got  # all of worker 1's buffers hold unconsumed batches
    pool.release(1, 0)
    t.join(5.0)
    assert got == [0]  # the released (oldest) buffer is the one reused


def test_a_buffer_released_out_of_fill_order_is_the_one_reused_and_a_double_release_is_refused():
    pool = BufferPool(num_workers=1, buffers=3, buffer_bytes=16)
    assert [pool.acquire(0) for _ in range(3)] == [0, 1, 2]
    pool.release(0, 1)  # the caller dropped the second batch and kept the first
    assert pool.acquire(0) == 1
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release(0, 1), pool.release(0, 1)
    pool.release(0, 2), pool.release(0, 0)
    assert [pool.acquire(0) for _ in range(3)] == [2, 0, 1]  # round robin from the last one taken


def test_abort_gives_the_buffer_back():
    pool = BufferPool(num_workers=1, buffers=2, buffer_bytes=16)
    assert pool.acquire(0) == 0
    pool.abort(0, 0)  # the batch failed before it was sent
    assert pool.acquire(0) == 1 and pool.acquire(0) == 0


def test_views_share_the_buffer_and_oversize_batches_are_refused():
    pool = BufferPool(num_workers=2, buffers=2, buffer_bytes=24)
    a, b = pool.view(1, 1, (2, 3, 4)), pool.view(1, 1, (4, 3))
    a.fill_(7)
    assert b.data_ptr() == a.data_ptr() and bool((b == 7).all())
    assert not bool(pool.view(1, 0, (24,)).any()) and not bool(pool.view(0, 1, (24,)).any())
    with pytest.raises(ValueError, match="does not fit"):
        pool.view(0, 0, (5, 5))


# --- through the DataLoader -----------------------------------------------------------------
# default ring (never waits), one buffer (always waits, never lent), two (one lent at a time)
@pytest.mark.parametrize("buffers", [0, 1, 2])
def test_workers_equal_the_single_process_path_batch_for_batch(shards_rgb, buffers):
    kw = dict(batch_size=7, seed=3, action_horizon=4, frame_offsets=(-2, 0), prune_slots=True)
    want = _epochs(ShardLoader(shards_rgb, LoaderConfig(num_workers=0, **kw)), 2)
    got = _epochs(ShardLoader(shards_rgb, LoaderConfig(num_workers=2, worker_buffers=buffers, **kw)), 2)
    _assert_same(got, want)  # kept across epochs: no kept batch's buffer was refilled


def test_device_path_borrows_recycled_buffers_and_equals_the_single_process_path(shards_rgb):
    kw = dict(batch_size=8, seed=4, action_horizon=3, pin_memory=False)
    want = list(ShardLoader(shards_rgb, LoaderConfig(num_workers=0, **kw)).device_batches("cpu", steps=14))
    loader = ShardLoader(shards_rgb, LoaderConfig(num_workers=2, **kw))
    got = list(loader.device_batches("cpu", steps=14))
    _assert_same(got, want)
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (1, 4)  # 10 steps per epoch


def test_a_worker_waiting_for_its_one_buffer_never_overwrites_the_batch_in_hand(shards_rgb):
    """One worker, one buffer: the worker must wait for every release, so each batch is read
    while the worker is blocked; a slow consumer gives an unguarded worker time to overwrite."""
    kw = dict(batch_size=8, seed=6, action_horizon=2)
    want = _epochs(ShardLoader(shards_rgb, LoaderConfig(num_workers=0, **kw)), 1)
    loader = ShardLoader(shards_rgb, LoaderConfig(num_workers=1, worker_buffers=1, **kw))
    stream = loader._stream(0, 0)
    for i, w in enumerate(want):
        b = next(stream)
        before = b["images"].clone()
        time.sleep(0.05)
        assert torch.equal(b["images"], before) and torch.equal(b["images"], w["images"]), i
        assert torch.equal(b["row"], w["row"])


def test_each_worker_cycles_through_its_own_buffers(shards_rgb):
    loader = ShardLoader(shards_rgb, LoaderConfig(batch_size=8, num_workers=2, worker_buffers=3))
    stream = loader._stream(0, 0)
    ptrs = [next(stream)["images"].data_ptr() for _ in range(18)]  # each batch dropped at once: lent back
    assert len(set(ptrs)) == 6  # 2 workers x 3 buffers, allocated once
    assert ptrs[:6] == ptrs[6:12] == ptrs[12:]  # round robin: batch n and n + 6 share a buffer


def test_skipped_samples_with_workers_equal_the_single_process_path(shards_rgb, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(shards_rgb, out)
    from datakit.shards.index import load_index
    os.remove(out / load_index(out).shards[1].name)
    kw = dict(batch_size=9, seed=1, on_error="skip", shuffle="sequential")
    want = _epochs(ShardLoader(out, LoaderConfig(num_workers=0, **kw)), 1)
    got = _epochs(ShardLoader(out, LoaderConfig(num_workers=2, **kw)), 1)
    assert sum(int(b["num_skipped"]) for b in want) > 0
    _assert_same(got, want)


def test_worker_buffers_must_not_be_negative():
    with pytest.raises(ValueError, match="worker_buffers"):
        LoaderConfig(worker_buffers=-1)

"""Sampler and anchor logic on synthetic episode tables (pure numpy; no shards needed).

Oracles: brute-force Python loops over episodes for anchors and windows, and set algebra
for the rank / step partition.
"""
import numpy as np
import pytest

from datakit.loader.anchors import EpisodeRows, Window, anchor_rows, window_rows
from datakit.loader.config import LoaderConfig
from datakit.loader.sampler import StepSampler, block_ids, epoch_order, mix64


def episodes(lengths):
    lengths = np.asarray(lengths, np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return EpisodeRows(episode_index=np.arange(len(lengths)), row_start=starts, length=lengths)


@pytest.mark.parametrize("mode", ["random", "shard_block", "sequential"])
def test_order_is_a_pure_function_of_seed_and_epoch(mode):
    blocks = block_ids(np.repeat(np.arange(5), 40), 16)
    a = epoch_order(200, seed=7, epoch=3, mode=mode, blocks=blocks)
    b = epoch_order(200, seed=7, epoch=3, mode=mode, blocks=blocks.copy())
    assert np.array_equal(a, b)
    assert sorted(a.tolist()) == list(range(200))  # a permutation
    if mode != "sequential":
        assert not np.array_equal(a, epoch_order(200, seed=7, epoch=4, mode=mode, blocks=blocks))
        assert not np.array_equal(a, epoch_order(200, seed=8, epoch=3, mode=mode, blocks=blocks))


def test_hash_is_pinned_across_versions():
    # resumed checkpoints rely on these exact bits; oracle: splitmix64 in plain Python ints
    def splitmix64(x, m=2**64 - 1):
        z = (x + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)
    xs = [0, 1, 2**63, 123456789]
    assert mix64(np.array(xs, np.uint64)).tolist() == [splitmix64(x) for x in xs]
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # the published first output of splitmix64(seed=0)
    assert epoch_order(10, seed=0, epoch=0, mode="random").tolist() == \
        np.argsort(mix64(np.arange(10, dtype=np.uint64) ^ (mix64(np.array([0], np.uint64))
                                                             ^ mix64(np.array([1], np.uint64)))),
                   kind="stable").tolist()


def test_shard_block_order_walks_contiguous_blocks():
    shards = np.repeat(np.arange(4), [50, 30, 70, 10])
    blocks = block_ids(shards, 16)
    # blocks never straddle a shard and hold at most 16 consecutive anchors
    for blk in np.unique(blocks):
        members = np.flatnonzero(blocks == blk)
        assert len(np.unique(shards[members])) == 1 and len(members) <= 16
        assert np.array_equal(members, np.arange(members[0], members[-1] + 1))
    order = epoch_order(len(shards), seed=1, epoch=0, mode="shard_block", blocks=blocks)
    seen = blocks[order]
    # each block is visited in one run (read sequentially), blocks in shuffled order
    runs = seen[np.concatenate(([True], seen[1:] != seen[:-1]))]
    assert len(runs) == len(np.unique(blocks))
    assert not np.array_equal(runs, np.sort(runs))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_and_steps_partition_the_epoch(world, drop_last):
    n, bs = 103, 5
    seen = []
    for rank in range(world):
        s = StepSampler(num_anchors=n, batch_size=bs, seed=3, rank=rank, world_size=world, drop_last=drop_last)
        seen.append([x for batch in s.iter_epoch(2) for x in batch])
    steps = len(seen[0]) // bs
    flat = np.concatenate(seen)
    if drop_last:
        assert len(set(flat.tolist())) == len(flat) == steps * bs * world  # disjoint
        assert n - len(flat) < bs * world  # only the tail that cannot fill a global batch is dropped
    else:
        assert set(flat.tolist()) == set(range(n))  # complete
        assert len(flat) - n < bs * world  # repeats only to fill the last global batch
    # same global batches whatever the world size: rank slices tile the global order
    order = epoch_order(n, seed=3, epoch=2, mode="random")
    for step in range(steps):
        got = np.concatenate([seen[r][step * bs:(step + 1) * bs] for r in range(world)])
        want = order[np.arange(step * bs * world, (step + 1) * bs * world) % n]
        assert np.array_equal(got, want)


def test_state_dict_resumes_exactly():
    s = StepSampler(num_anchors=50, batch_size=4, seed=11)
    unbroken = []
    for _ in range(30):  # crosses an epoch boundary (12 steps per epoch)
        unbroken.append(s.batch(s.epoch, s.step).tolist())
        s.advance()
    s2 = StepSampler(num_anchors=50, batch_size=4, seed=11)
    for _ in range(17):
        s2.advance()
    state = s2.state_dict()
    s3 = StepSampler(num_anchors=50, batch_size=4, seed=11)
    s3.load_state_dict(state)
    resumed = []
    for _ in range(13):
        resumed.append(s3.batch(s3.epoch, s3.step).tolist())
        s3.advance()
    assert resumed == unbroken[17:]
    with pytest.raises(ValueError, match="seed"):
        StepSampler(num_anchors=50, batch_size=4, seed=12).load_state_dict(state)
    with pytest.raises(ValueError, match="num_anchors"):
        StepSampler(num_anchors=51, batch_size=4, seed=11).load_state_dict(state)


def brute_anchors(lengths, lo, hi, boundary):
    rows, start = [], 0
    for n in lengths:
        for t in range(n):
            if boundary == "pad" or (t + lo >= 0 and t + hi <= n - 1):
                rows.append(start + t)
        start += n
    return rows


@pytest.mark.parametrize("boundary", ["pad", "skip"])
@pytest.mark.parametrize("offsets,horizon", [((0,), 1), ((0,), 5), ((-3, -1, 0), 4), ((-6, -3, 0, 2), 1)])
def test_anchor_rows_match_brute_force(boundary, offsets, horizon):
    lengths = [9, 1, 12, 4, 7]
    w = Window.of([offsets], (0,), horizon)
    got = anchor_rows(episodes(lengths), w, boundary)
    assert got.tolist() == brute_anchors(lengths, w.lo, w.hi, boundary)


def test_window_rows_clamp_and_mask():
    eps = episodes([5, 3])
    anchors = np.array([0, 4, 5, 7])
    ep = np.array([0, 0, 1, 1])
    rows, pad = window_rows(anchors, (-2, 0, 1), eps.row_start[ep], eps.length[ep])
    assert rows.tolist() == [[0, 0, 1], [2, 4, 4], [5, 5, 6], [5, 7, 7]]
    assert pad.tolist() == [[True, False, False], [False, False, True], [True, False, False],
                            [False, False, True]]


def test_windows_beyond_the_index_are_rejected_with_the_reason():
    with pytest.raises(ValueError, match="longest episode in the index has 12"):
        anchor_rows(episodes([9, 12]), Window.of([tuple(range(-20, 1))], (0,), 1), "pad")
    with pytest.raises(ValueError, match="boundary='skip' needs episodes of at least 15"):
        anchor_rows(episodes([9, 12]), Window.of([(0,)], (0,), 15), "skip")


def test_config_checks():
    with pytest.raises(ValueError, match="strictly increasing"):
        LoaderConfig(frame_offsets=(0, -1))
    with pytest.raises(ValueError, match="shuffle"):
        LoaderConfig(shuffle="perrank")
    with pytest.raises(ValueError, match="rank"):
        LoaderConfig(rank=2, world_size=2)
    with pytest.raises(ValueError, match="twice"):
        LoaderConfig(slots=("a", "a"))
    with pytest.raises(ValueError, match="global batch"):
        StepSampler(num_anchors=10, batch_size=4, world_size=3)


@pytest.mark.parametrize("world, rank, drop_last", [(1, 0, True), (3, 2, False)])
def test_batches_all_at_once_equal_batch_by_batch(world, rank, drop_last):
    s = StepSampler(num_anchors=103, batch_size=4, seed=5, mode="shard_block", rank=rank, world_size=world,
                    drop_last=drop_last, blocks=block_ids(np.repeat(np.arange(7), 15)[:103], 8))
    for start in (0, 3):
        got = s.batches(2, start)
        want = [s.batch(2, k) for k in range(start, s.steps_per_epoch)]
        assert got.shape == (len(want), 4) and all(np.array_equal(g, w) for g, w in zip(got, want))


def test_remote_cache_config_checks():
    with pytest.raises(ValueError, match="cache_bytes"):
        LoaderConfig(cache_bytes=-1)
    with pytest.raises(ValueError, match="cache_dir"):
        LoaderConfig(cache_dir="s3://bucket/cache")
    with pytest.raises(ValueError, match="storage_options"):
        LoaderConfig(storage_options=["endpoint_url"])
    from pathlib import Path

    assert LoaderConfig(cache_dir=Path("/nvme/c")).cache_dir == "/nvme/c"

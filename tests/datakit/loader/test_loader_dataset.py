"""ShardDataset / ShardLoader on real converted shards, against the reader as the oracle.

The reader (`datakit.reader`) reads one frame at a time through a different code path
(memmap slice per frame); the loader's batched preadv must return the same bytes, with the
windows clamped and masked as a per-sample Python loop says.
"""
import os
import shutil

import numpy as np
import pytest
import torch

from datakit.errors import ShardError
from datakit.loader import LoaderConfig, ShardDataset, ShardLoader
from datakit.reader import open_shards
from loader_fixtures import CAMS, shards_mixed, shards_mixed_nv12, shards_nv12, shards_rgb  # noqa: F401


def check_batch_against_reader(ds, batch, reader, offsets, state_offsets, horizon):
    kept = [ds.slots.cameras[i] for i in batch["slot_index"].tolist()]
    state_all = np.stack([reader.frames.column("state")[i].as_py() for i in range(len(reader))])
    action_all = np.stack([reader.frames.column("action")[i].as_py() for i in range(len(reader))])
    for i in range(batch["row"].numel()):
        ep, f = int(batch["episode_index"][i]), int(batch["frame_index"][i])
        n = next(e.length for e in reader.index.episodes if e.episode_index == ep)
        assert reader.row(ep, f) == int(batch["row"][i])
        for j, cam in enumerate(kept):
            for t, o in enumerate(offsets):
                g = min(max(f + o, 0), n - 1)
                want = reader.read_raw(reader.row(ep, g), cam)
                assert np.array_equal(batch["images"][i, j, t].numpy(), want), (i, cam, o)
                assert bool(batch["image_is_pad"][i, j, t]) == (not 0 <= f + o < n)
        for t, o in enumerate(state_offsets):
            g = min(max(f + o, 0), n - 1)
            assert np.array_equal(batch["state"][i, t].numpy(), state_all[reader.row(ep, g)])
        for h in range(horizon):
            g = min(f + h, n - 1)
            assert np.array_equal(batch["action"][i, h].numpy(), action_all[reader.row(ep, g)])
            assert bool(batch["action_is_pad"][i, h]) == (f + h >= n)


@pytest.mark.parametrize("offsets", [(0,), (-4, -2, 0), tuple(range(-8, 1))])
def test_batch_equals_reader(shards_rgb, offsets):
    cfg = LoaderConfig(frame_offsets=offsets, state_offsets=(-1, 0), action_horizon=6, prune_slots=False)
    ds = ShardDataset(shards_rgb, cfg)
    positions = list(range(0, len(ds), 3))
    batch = ds.read_batch(positions)
    assert batch["images"].shape == (len(positions), 3, len(offsets), 32, 64, 3)
    check_batch_against_reader(ds, batch, open_shards(shards_rgb), offsets, (-1, 0), 6)


def test_nv12_batch_equals_reader(shards_nv12):
    ds = ShardDataset(shards_nv12, LoaderConfig(frame_offsets=(-1, 0), action_horizon=3))
    batch = ds.read_batch(list(range(len(ds))))
    assert batch["images"].shape[-2:] == (48, 64)  # (H * 3/2, W)
    check_batch_against_reader(ds, batch, open_shards(shards_nv12), (-1, 0), (0,), 3)


def test_skip_boundary_keeps_only_full_windows(shards_rgb):
    ds = ShardDataset(shards_rgb, LoaderConfig(frame_offsets=(-4, 0), action_horizon=5, boundary="skip"))
    batch = ds.read_batch(list(range(len(ds))))
    assert len(ds) == sum(n - 4 - 4 for n in (24, 31, 17, 9))
    assert not batch["image_is_pad"].any() and not batch["action_is_pad"].any()


def test_window_beyond_index_is_rejected(shards_rgb):
    with pytest.raises(ValueError, match="longest episode"):
        ShardDataset(shards_rgb, LoaderConfig(frame_offsets=tuple(range(-40, 1))))
    with pytest.raises(ValueError, match="unknown cameras"):
        ShardDataset(shards_rgb, LoaderConfig(slots=("observation.images.nope",)))


def test_slots_are_pruned_and_masked(shards_mixed):
    reader = open_shards(shards_mixed)
    cfg = LoaderConfig(slots=(CAMS[0], None, CAMS[1], CAMS[2]), batch_size=8)
    ds = ShardDataset(shards_mixed, cfg)
    ep_rows = {e.episode_index: e.row_start for e in reader.index.episodes}
    pos_of = {int(r): i for i, r in enumerate(ds.anchors)}
    # a batch of episodes 0 and 1: slot `None` and the blank side camera are dropped
    b = ds.read_batch([pos_of[ep_rows[0] + 2], pos_of[ep_rows[1] + 5]])
    assert b["slot_index"].tolist() == [0, 2]
    assert b["image_mask"].tolist() == [[True, True], [False, True]]  # episode 1's top is blank
    # episode 3 alone: wrist missing -> only top stays; its bytes equal the reader's
    b = ds.read_batch([pos_of[ep_rows[3] + 1]])
    assert b["slot_index"].tolist() == [0] and b["image_mask"].tolist() == [[True]]
    # without pruning the missing camera reads as zeros and is masked out
    full = ds.read_batch([pos_of[ep_rows[3] + 1]], prune=False)
    assert full["images"].shape[1] == 4
    assert full["image_mask"].tolist() == [[True, False, False, False]]
    assert not full["images"][0, 1].any() and not full["images"][0, 2].any()
    assert np.array_equal(full["images"][0, 0, 0].numpy(), reader.read_raw(ep_rows[3] + 1, CAMS[0]))


@pytest.mark.parametrize("fixture", ["shards_mixed", "shards_mixed_nv12"])
def test_a_missing_camera_is_black_in_either_layout(request, fixture):
    """A slot with no camera (or a missing one) is a black frame once normalised, whatever the
    folder's colour layout: zero nv12 bytes would decode to green (RGB 0/135/0)."""
    from datakit.loader import Normaliser

    root = request.getfixturevalue(fixture)
    reader = open_shards(root)
    ds = ShardDataset(root, LoaderConfig(slots=(CAMS[0], None, CAMS[1]), image_dtype="float32",
                                         image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0)))
    ep3 = next(e.row_start for e in reader.index.episodes if e.episode_index == 3)
    b = ds.read_batch([int(np.flatnonzero(ds.anchors == ep3 + 1)[0])], prune=False)
    assert b["image_mask"].tolist() == [[True, False, False]]  # slot None and episode 3's missing wrist
    if reader.index.layout == "nv12":  # the raw bytes: luma 0, chroma 128
        h = b["images"].shape[-2] * 2 // 3
        assert not b["images"][0, 1:, :, :h].any() and bool((b["images"][0, 1:, :, h:] == 128).all())
    rgb = Normaliser.from_index(reader.index, ds.cfg)(b)["images"]  # (B, K, T, 3, H, W) in [0, 1]
    assert float(rgb[0, 1:].abs().max()) < 1e-6, "a missing slot must be black"
    assert float(rgb[0, 0].max()) > 0.1  # positive control: the real camera is not


def test_workers_give_the_same_batches_as_the_main_process(shards_rgb):
    def rows(workers, shuffle):
        cfg = LoaderConfig(batch_size=7, num_workers=workers, shuffle=shuffle, block_size=10, seed=5)
        return [b["row"].tolist() for b in ShardLoader(shards_rgb, cfg)]
    for shuffle in ("random", "shard_block"):
        single = rows(0, shuffle)
        assert rows(2, shuffle) == single
        flat = [r for b in single for r in b]
        assert len(flat) == len(set(flat)) == (81 // 7) * 7


def test_ranks_are_disjoint_and_complete(shards_rgb):
    seen = []
    for rank in range(3):
        loader = ShardLoader(shards_rgb, LoaderConfig(batch_size=9, rank=rank, world_size=3, drop_last=False))
        seen += [r for b in loader for r in b["row"].tolist()]
    assert set(seen) == set(range(81)) and len(seen) == 81  # 81 = 3 ranks x 3 steps x 9


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_step_k_sees_the_unbroken_batches(shards_rgb, workers):
    cfg = LoaderConfig(batch_size=8, num_workers=workers, seed=9, action_horizon=3)
    unbroken = ShardLoader(shards_rgb, cfg)
    want = [b["row"].tolist() for _ in range(2) for b in unbroken]  # two epochs, 10 steps each
    broken = ShardLoader(shards_rgb, cfg)
    got, state = [], None
    for i, b in enumerate(broken):
        got.append(b["row"].tolist())
        if i == 6:
            state = broken.state_dict()  # checkpoint while holding step 6
            break
    resumed = ShardLoader(shards_rgb, cfg)
    resumed.load_state_dict(state)
    while len(got) < len(want):
        got += [b["row"].tolist() for b in resumed]
    assert got == want
    assert want[:10] != want[10:]  # the second epoch is a different order


def test_resume_through_the_device_batcher(shards_rgb):
    cfg = LoaderConfig(batch_size=8, seed=2, pin_memory=False)
    want = [b["row"].tolist() for b in ShardLoader(shards_rgb, cfg)]
    first = ShardLoader(shards_rgb, cfg)
    it = first.device_batches("cpu")
    got = [next(it)["row"].tolist() for _ in range(4)]
    state = first.state_dict()  # the batcher prefetched ahead; the state must not count that
    assert state["step"] == 4
    second = ShardLoader(shards_rgb, cfg)
    second.load_state_dict(state)
    got += [b["row"].tolist() for b in second.device_batches("cpu", steps=len(want) - 4)]
    assert got == want


def test_device_batches_host_hook_adds_per_batch_extras(shards_rgb):
    """`extras` sees every host batch once, in order, with its loader position; what it adds arrives
    unchanged, the rest equals the stream without the hook, and the state advances as without it.
    Oracle: the hook-free stream, and (epoch, step) recomputed from the batch index by hand."""
    cfg = LoaderConfig(batch_size=8, seed=2, pin_memory=False)
    plain = list(ShardLoader(shards_rgb, cfg).device_batches("cpu", steps=12))
    seen = []

    def extras(hb):
        seen.append((int(hb["epoch"]), int(hb["step"])))
        assert hb["images"].dtype == torch.uint8  # before normalisation
        return {**hb, "tag": torch.full((hb["row"].shape[0], 2), 10.0 * int(hb["epoch"]) + int(hb["step"]))}

    loader = ShardLoader(shards_rgb, cfg)
    per_epoch = loader.sampler.steps_per_epoch
    hooked = list(loader.device_batches("cpu", steps=12, extras=extras))
    where = [divmod(i, per_epoch) for i in range(12)]
    assert seen[:12] == where  # the batcher may read one ahead; never out of order
    for b, p, (epoch, step) in zip(hooked, plain, where):
        assert torch.equal(b["tag"], torch.full((8, 2), 10.0 * epoch + step))
        assert set(b) == set(p) | {"tag"}
        assert all(torch.equal(b[k], p[k]) for k in p)
    assert loader.state_dict()["step"] == 12 % per_epoch and loader.state_dict()["epoch"] == 12 // per_epoch


def test_missing_shard_is_named_or_skipped(shards_rgb, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(shards_rgb, out)
    reader = open_shards(out)
    victim = reader.index.shards[1]
    os.remove(out / victim.name)
    ds = ShardDataset(out, LoaderConfig(batch_size=81, shuffle="sequential"))
    with pytest.raises(ShardError, match=victim.name + ": missing shard file"):
        ds.read_batch(list(range(len(ds))))
    ds = ShardDataset(out, LoaderConfig(on_error="skip"))
    batch = ds.read_batch(list(range(len(ds))))
    lost = set(range(*victim.rows))
    assert int(batch["num_skipped"]) == len(lost) and ds.num_skipped == len(lost)
    assert set(batch["row"].tolist()) == set(range(81)) - lost
    check_batch_against_reader(ds, {k: v for k, v in batch.items()}, open_shards(shards_rgb), (0,), (0,), 1)


def test_damaged_shard_is_detected(shards_rgb, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(shards_rgb, out)
    name = open_shards(out).index.shards[0].name
    data = bytearray((out / name).read_bytes())
    data[5000] ^= 0xFF  # one flipped byte: same size, different hash
    (out / name).write_bytes(bytes(data))
    with pytest.raises(ShardError, match=name + ": sha256"):
        ShardDataset(out, LoaderConfig(verify="sha256")).read_batch([0])
    (out / name).write_bytes(bytes(data[:-1000]))  # truncated
    with pytest.raises(ShardError, match=name + ": size"):
        ShardDataset(out, LoaderConfig()).read_batch([0])


def test_dataset_pickles_without_its_arrays(shards_rgb):
    import pickle
    ds = ShardDataset(shards_rgb, LoaderConfig(action_horizon=4))
    blob = pickle.dumps(ds)
    assert len(blob) < 4096
    again = pickle.loads(blob)
    a, b = ds.read_batch([1, 40]), again.read_batch([1, 40])
    assert all(torch.equal(a[k], b[k]) for k in a)

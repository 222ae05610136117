"""`datakit plan` against independent oracles: the real loader's batches (the image bytes each
batch reads, counted with Python sets from the kept slots it returns and the frames table, and
its host-to-device bytes), brute force over the sampler's per-rank batches (working sets, peak
step bytes), a list-based LRU (downloads), and the real loader's samples/s timed here, apart from
the planner's code (the ceiling)."""
import argparse
import dataclasses
import json
import time

import pytest

from loader_fixtures import CAMS, SIZES, shards_mixed, shards_rgb, sizes_rgb  # noqa: F401 - fixtures

from datakit.loader import ShardLoader, h2d_bytes, slot_images
from datakit.loader.config import LoaderConfig
from datakit.loader.sampler import StepSampler, block_ids
from datakit.commands.plan.command import add_parser, run
from datakit.loader.throughput.model import plan_throughput
from datakit.shards.index import OFFSET_PREFIX, column, load_frames, load_index


# Pi0.5-shaped samples, the fields trainkit's pi05 loader preset sets (trainkit/models/pi05/batches.py)
PI05_SHAPE = {"frame_offsets": (0,), "action_horizon": 50, "norm": "quantile"}
PI05_TOML = '[loader]\nframe_offsets = [0]\naction_horizon = 50\nnorm = "quantile"\n'


def pi05_toml(tmp_path) -> str:
    """A --loader-config file of PI05_SHAPE (what `trainkit inspect --loader-toml` would write, cut to it)."""
    path = tmp_path / "pi05-loader.toml"
    path.write_text(PI05_TOML)
    return str(path)


def loader_epoch(folder, cfg, ranks):
    """One epoch of the real loader on every rank: (image bytes read, samples, mean images bytes
    per batch, mean other host-to-device bytes per batch, mean kept slots per batch). A batch
    reads, for each slot it kept (`slot_index`) that names a camera, the distinct rows of its
    samples' windows (clamped to the episode) where that camera has a frame."""
    index, frames = load_index(folder), load_frames(folder)
    eps = {e.episode_index: e for e in index.episodes}
    offsets = {c: column(frames, OFFSET_PREFIX + c).tolist() for c in index.cameras}
    slots = cfg.slots or tuple(index.cameras)
    read = samples = 0
    images, other, kept = [], [], []
    for r in range(ranks):
        loader = ShardLoader(folder, dataclasses.replace(cfg, rank=r, world_size=ranks, num_workers=0))
        for batch in loader:
            for s in batch["slot_index"].tolist():
                cam = slots[s]
                if cam is None:
                    continue
                got = set()
                for row, e in zip(batch["row"].tolist(), batch["episode_index"].tolist()):
                    lo, hi = eps[e].row_start, eps[e].row_start + eps[e].length - 1
                    for o in cfg.offsets_for(cam):
                        rr = min(max(row + o, lo), hi)
                        if offsets[cam][rr] >= 0:
                            got.add(rr)
                read += len(got) * index.cameras[cam].frame_bytes
            samples += batch["row"].numel()
            image_bytes = sum(v.nbytes for v in slot_images(batch))  # stacked, or per slot (cameras' own sizes)
            images.append(image_bytes)
            other.append(h2d_bytes(batch) - image_bytes)
            kept.append(batch["slot_index"].numel())
        loader.close()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return read, samples, mean(images), mean(other), mean(kept)


def brute_anchors(index, cfg):
    offs = [o for c in CAMS for o in cfg.offsets_for(c)] + list(cfg.state_offsets) + [0, cfg.action_horizon - 1]
    lo, hi = min(offs), max(offs)
    rows = []
    for e in sorted(index.episodes, key=lambda e: e.row_start):
        for t in range(e.length):
            if cfg.boundary == "pad" or (t + lo >= 0 and t + hi < e.length):
                rows.append((e.row_start + t, e.row_start, e.length))
    return rows


def brute_lru(steps, sizes, capacity):
    cache, got = [], 0  # most recent last
    for shards in steps:
        for s in sorted(shards):
            if s in cache:
                cache.remove(s)
                cache.append(s)
                continue
            got += sizes[s]
            cache.append(s)
            while sum(sizes[x] for x in cache) > capacity and len(cache) > 1:
                cache.pop(0)
    return got


# shards_mixed: 3 cameras; `side` blank in every episode, `top` blank in episode 1, `wrist`
# missing in episode 3. Windows of 3 consecutive frames overlap within a batch in sequential order
# and repeat the edge frame at episode ends with "pad": the loader reads such a frame once.
@pytest.mark.parametrize("shuffle,boundary,ranks,per_node,prune", [
    ("shard_block", "skip", 2, 1, True), ("shard_block", "pad", 4, 2, False), ("random", "pad", 2, 2, True),
    ("sequential", "pad", 1, 8, True)])
def test_plan_matches_the_loader_and_a_brute_force_computation(shards_mixed, shuffle, boundary, ranks, per_node,
                                                               prune):
    mixed = shards_mixed
    index, frames = load_index(mixed), load_frames(mixed)
    cfg = LoaderConfig(frame_offsets=(-2, -1, 0), action_horizon=5, state_offsets=(-1, 0), batch_size=3,
                       shuffle=shuffle, block_size=7, boundary=boundary, prune_slots=prune)
    sizes = [s.bytes for s in index.shards]
    n = 900.0
    cache = max(sizes) + 1
    plan = plan_throughput(index, frames, cfg, samples_per_s=n, ranks=ranks, ranks_per_node=per_node, cache_bytes=cache)

    anchors = brute_anchors(index, cfg)
    assert plan.num_anchors == len(anchors)
    read, samples, images, other, kept = loader_epoch(mixed, cfg, ranks)
    want_img = read / samples
    assert plan.image_bytes_per_sample == pytest.approx(want_img)
    fb = index.cameras[CAMS[0]].frame_bytes
    assert want_img < (3 if prune else 2.5) * 3 * fb  # pruned blank slots and doubly asked frames cost nothing
    numeric = (2 * len(index.state_names) + 5 * len(index.action_names)) * 4
    assert plan.bytes_per_sample == pytest.approx(want_img + numeric)
    g = min(per_node, ranks)
    assert plan.read_bytes_per_s_per_node == pytest.approx(n * g / ranks * (want_img + numeric))
    assert plan.kept_slots_per_step == pytest.approx(kept)
    assert plan.h2d_image_bytes_per_step_uint8 == pytest.approx(images)
    assert abs(plan.h2d_other_bytes_per_step - other) <= 64  # masks, state, action, indices

    shard_col = column(frames, "shard")
    anchor_shard = shard_col[[r for r, _, _ in anchors]]
    sampler = StepSampler(num_anchors=len(anchors), batch_size=3, seed=0, mode=shuffle, world_size=ranks,
                          blocks=block_ids(anchor_shard, 7) if shuffle == "shard_block" else None)
    per_rank = {r: set() for r in range(ranks)}
    step_sets = {node: [] for node in range(-(-ranks // g))}
    for step in range(sampler.steps_per_epoch):
        for node in step_sets:
            step_sets[node].append(set())
        for r in range(ranks):
            got = {int(anchor_shard[p]) for p in sampler.batch(0, step, r)}
            per_rank[r] |= got
            step_sets[r // g][-1] |= got
    assert plan.steps_per_epoch == sampler.steps_per_epoch
    assert plan.working_set_bytes_per_rank == max(sum(sizes[s] for s in v) for v in per_rank.values())
    assert plan.working_set_bytes_per_node == max(sum(sizes[s] for s in set().union(*v)) for v in step_sets.values())
    assert plan.peak_step_bytes_per_node == max(sum(sizes[s] for s in st) for v in step_sets.values() for st in v)
    assert plan.downloaded_bytes_per_epoch_per_node == max(brute_lru(v, sizes, cache) for v in step_sets.values())


def test_a_blank_camera_costs_no_bytes(shards_rgb):
    """The issue's finding: 3 cameras, one blank in every episode. The loader prunes the blank slot
    and reads 2 frames per sample; the plan counted 3 (1.5x the bandwidth)."""
    index, frames = load_index(shards_rgb), load_frames(shards_rgb)
    assert {e.camera_status[CAMS[2]] for e in index.episodes} == {"blank"}
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=4)
    plan = plan_throughput(index, frames, cfg, samples_per_s=100.0)
    read, samples, images, _, kept = loader_epoch(shards_rgb, cfg, 1)
    assert plan.image_bytes_per_sample == read / samples == 2 * index.cameras[CAMS[0]].frame_bytes
    assert plan.h2d_image_bytes_per_step_uint8 == images and plan.kept_slots_per_step == kept == 2


@pytest.mark.parametrize("prune", [True, False])
def test_plan_counts_each_cameras_own_bytes(sizes_rgb, prune):
    """Cameras of different sizes (120x160, 96x128, a blank 120x160): every byte count takes each
    camera's own frame bytes, against the loader's batches; the blank one costs nothing when pruned."""
    _, out = sizes_rgb
    index, frames = load_index(out), load_frames(out)
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=4, prune_slots=prune)
    plan = plan_throughput(index, frames, cfg, samples_per_s=100.0)
    read, samples, images, other, kept = loader_epoch(out, cfg, 1)
    frame = {cam: h * w * 3 for cam, (h, w) in SIZES.items()}
    assert plan.image_bytes_per_sample == read / samples
    assert plan.image_bytes_per_sample_by_camera == {CAMS[0]: frame[CAMS[0]], CAMS[1]: frame[CAMS[1]],
                                                     CAMS[2]: 0 if prune else frame[CAMS[2]]}
    assert plan.h2d_image_bytes_per_step_uint8 == images == 4 * sum(frame[c] for c in CAMS[:2 if prune else 3])
    assert plan.kept_slots_per_step == kept and abs(plan.h2d_other_bytes_per_step - other) <= 64


def test_plan_prints_the_bytes_of_each_camera(sizes_rgb, capsys, monkeypatch):
    _, out = sizes_rgb
    monkeypatch.setenv("COLUMNS", "250")  # one table row on one line
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="command"))
    assert run(ap.parse_args(["plan", str(out), "--samples-per-s", "100", "--batch-size", "4", "--workers", "0"])) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"{CAMS[0]} 56.25 KiB, {CAMS[1]} 36.00 KiB, {CAMS[2]} 0 B" in text


@pytest.mark.timeout(120)
def test_plan_command_json_and_measure(shards_rgb, capsys, tmp_path):
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", str(shards_rgb), "--samples-per-s", "640", "--ranks", "2",
                          "--loader-config", pi05_toml(tmp_path),
                          "--batch-size", "4", "--shuffle", "shard_block", "--measure", "--measure-seconds", "0.3",
                          "--workers", "0", "--json"])
    assert run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    index = load_index(shards_rgb)
    cams_bytes = 2 * index.cameras[CAMS[0]].frame_bytes  # pi05: one frame of each real camera
    assert doc["plan"]["image_bytes_per_sample"] == cams_bytes
    assert doc["plan"]["h2d_image_bytes_per_step_uint8"] == 4 * cams_bytes
    assert doc["measured"]["bytes_read"] == sum(s.bytes for s in index.shards)
    assert doc["measured"]["disk_bytes_per_s"] > 0 and doc["verdicts"]
    top, per_sample = doc["ceiling"], doc["plan"]["bytes_per_sample"]
    # both ranks on one node share its page cache; each has its own loader
    assert top["page_cache_samples_per_s"] == pytest.approx(doc["measured"]["page_cache_bytes_per_s"] / per_sample)
    assert top["loader_samples_per_s"] == pytest.approx(2 * doc["loader"]["samples_per_s"])  # 2 ranks
    assert doc["loader"]["workers"] == 0 and doc["loader"]["seconds"] >= 0.3
    assert top["samples_per_s"] == min(top["page_cache_samples_per_s"], top["loader_samples_per_s"])
    assert doc["verdicts"][0].startswith("ceiling: ")
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        run(ap.parse_args(["plan", str(shards_rgb), "--samples-per-s", "1", "--ranks", "64", "--batch-size", "32"]))


def timed_loader(folder, cfg, seconds):
    """Samples/s of `for batch in ShardLoader(...)`, timed here after 3 batches, across epochs."""
    loader = ShardLoader(folder, cfg)
    n, samples, t0 = 0, 0, None
    while t0 is None or time.perf_counter() - t0 < seconds:
        for batch in loader:
            n += 1
            if n == 3:
                t0 = time.perf_counter()
            elif n > 3:
                samples += len(batch["row"])
                if time.perf_counter() - t0 >= seconds:
                    break
    rate = samples / (time.perf_counter() - t0)
    loader.close()
    return rate


@pytest.mark.timeout(180)
def test_ceiling_is_the_loaders_measured_rate(shards_rgb, capsys, tmp_path):
    """On cached shards the loader binds: the planner's ceiling for 2 ranks is twice what one rank's
    `ShardLoader` gives when timed here, apart from the planner. Rounds alternate and each side
    keeps its best, so a busy machine slows both alike; 25% (the goal is 15%, proven at native
    resolution by bench/data/bench_plan.py) is a margin for a 2-core box shared with other work, and still
    far below the factors a wrong config (workers, slots), a missing rank factor or a
    page-cache-only ceiling would give."""
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="command"))
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=8, num_workers=0)
    planned, timed = [], []
    for _ in range(3):
        assert run(ap.parse_args(["plan", str(shards_rgb), "--samples-per-s", "100", "--ranks", "2",
                                  "--loader-config", pi05_toml(tmp_path), "--batch-size", "8", "--workers", "0",
                                  "--measure", "--measure-seconds", "1",
                                  "--json"])) == 0
        top = json.loads(capsys.readouterr().out)["ceiling"]
        assert top["bound"] == "loader"
        planned.append(top["samples_per_s"])
        timed.append(2 * timed_loader(shards_rgb, cfg, 1.0))
    assert max(planned) == pytest.approx(max(timed), rel=0.25), (planned, timed)


def test_the_disk_binds_when_the_working_set_outgrows_memory(shards_rgb):
    """Hand arithmetic on given rates: 4 ranks on 2 nodes (2 a node); the node's page cache or disk
    feeds its 2 ranks, each rank's loader feeds itself."""
    from datakit.loader.throughput.ceiling import ceiling
    from datakit.loader.throughput.measure import Bandwidth, LoaderRate

    index, frames = load_index(shards_rgb), load_frames(shards_rgb)
    plan = plan_throughput(index, frames, LoaderConfig(**PI05_SHAPE, batch_size=4), samples_per_s=100.0, ranks=4,
                           ranks_per_node=2)
    per_sample = plan.bytes_per_sample
    rate = LoaderRate(samples_per_s=1e6, samples=1, seconds=1.0, workers=2, cores=2)
    roomy = Bandwidth(bytes_read=1, disk_bytes_per_s=1e6, page_cache_bytes_per_s=1e9, memory_bytes=1 << 40)
    top = ceiling(plan, roomy, rate)  # everything fits in memory: the disk only slows the first epoch
    assert (top.bound, top.working_set_fits) == ("page cache", True)
    assert top.samples_per_s == pytest.approx(2 * 1e9 / per_sample)
    tight = dataclasses.replace(roomy, memory_bytes=plan.working_set_bytes_per_node)  # 80% of it is too small
    top = ceiling(plan, tight, rate)
    assert (top.bound, top.working_set_fits) == ("disk", False)
    assert top.samples_per_s == pytest.approx(2 * 1e6 / per_sample)
    slow = dataclasses.replace(rate, samples_per_s=10.0)
    assert (ceiling(plan, tight, slow).bound, ceiling(plan, tight, slow).samples_per_s) == ("loader", 40.0)

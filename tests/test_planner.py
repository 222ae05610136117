"""`datakit plan` numbers against a brute-force computation from the index: Python loops over
every anchor and offset (bytes per sample), the sampler's per-rank batches (working sets, peak
step bytes), a list-based LRU (downloads), and the loader's real batch (host-to-device bytes)."""
import argparse
import json
import shutil

import pyarrow as pa
import pytest

from storage_fixtures import CAMS, converted  # noqa: F401 (fixture)

from datakit.loader.config import LoaderConfig
from datakit.loader.sampler import StepSampler, block_ids
from datakit.planner.command import add_parser, run
from datakit.planner.model import plan_throughput
from datakit.shards.index import FRAMES_NAME, OFFSET_PREFIX, column, load_frames, load_index, write_frames


@pytest.fixture(scope="module")
def mixed(converted, tmp_path_factory):
    """The converted folder with camera `wrist` missing in episode 2 (offsets -1)."""
    out = tmp_path_factory.mktemp("plan") / "out"
    shutil.copytree(converted, out)
    table = load_frames(out)
    col = OFFSET_PREFIX + CAMS[1]
    off = table.column(col).to_numpy().copy()
    off[table.column("episode_index").to_numpy() == 2] = -1
    table = table.set_column(table.schema.get_field_index(col), col, pa.array(off))
    (out / FRAMES_NAME).unlink()
    write_frames(out / FRAMES_NAME, table)
    return out


def brute_anchors(index, cfg):
    offs = [o for c in CAMS for o in cfg.offsets_for(c)] + list(cfg.state_offsets) + [0, cfg.action_horizon - 1]
    lo, hi = min(offs), max(offs)
    rows = []
    for e in sorted(index.episodes, key=lambda e: e.row_start):
        for t in range(e.length):
            if cfg.boundary == "pad" or (t + lo >= 0 and t + hi < e.length):
                rows.append((e.row_start + t, e.row_start, e.length))
    return rows


def brute_image_bytes(index, frames, cfg, anchors):
    total = 0
    offsets = {cam: column(frames, OFFSET_PREFIX + cam).tolist() for cam in CAMS}
    for row, start, length in anchors:
        for cam in CAMS:
            off = offsets[cam]
            for o in cfg.offsets_for(cam):
                r = min(max(row + o, start), start + length - 1)
                if off[r] >= 0:
                    total += index.cameras[cam].frame_bytes
    return total / len(anchors)


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


@pytest.mark.parametrize("shuffle,boundary,ranks,per_node", [
    ("shard_block", "skip", 2, 1), ("shard_block", "pad", 4, 2), ("random", "pad", 2, 2), ("sequential", "skip", 1, 8)])
def test_plan_matches_a_brute_force_computation(mixed, shuffle, boundary, ranks, per_node):
    index, frames = load_index(mixed), load_frames(mixed)
    cfg = LoaderConfig(frame_offsets=(-3, 0), action_horizon=5, state_offsets=(-1, 0), batch_size=3,
                       shuffle=shuffle, block_size=7, boundary=boundary, prune_slots=False)
    sizes = [s.bytes for s in index.shards]
    n = 900.0
    cache = max(sizes) + 1
    plan = plan_throughput(index, frames, cfg, samples_per_s=n, ranks=ranks, ranks_per_node=per_node, cache_bytes=cache)

    anchors = brute_anchors(index, cfg)
    assert plan.num_anchors == len(anchors)
    want_img = brute_image_bytes(index, frames, cfg, anchors)
    assert plan.image_bytes_per_sample == pytest.approx(want_img)
    assert want_img < len(CAMS) * 2 * index.cameras[CAMS[0]].frame_bytes  # the missing camera costs nothing
    numeric = (2 * len(index.state_names) + 5 * len(index.action_names)) * 4
    assert plan.bytes_per_sample == pytest.approx(want_img + numeric)
    g = min(per_node, ranks)
    assert plan.read_bytes_per_s_per_node == pytest.approx(n * g / ranks * (want_img + numeric))

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


def test_host_to_device_bytes_equal_the_loaders_batch(converted):
    from datakit.loader.dataset import ShardDataset

    index, frames = load_index(converted), load_frames(converted)
    cfg = LoaderConfig(frame_offsets=(-2, 0), action_horizon=4, batch_size=5, pin_memory=False)
    plan = plan_throughput(index, frames, cfg, samples_per_s=100.0)
    batch = ShardDataset(converted, cfg).read_batch(list(range(5)))
    assert plan.h2d_image_bytes_per_step_uint8 == batch["images"].numel() * batch["images"].element_size()
    assert plan.h2d_image_bytes_per_step_float32 == 4 * plan.h2d_image_bytes_per_step_uint8
    numeric = sum(batch[k].numel() * batch[k].element_size() for k in ("state", "action"))
    assert plan.h2d_other_bytes_per_step >= numeric


@pytest.mark.timeout(120)
def test_plan_command_json_and_measure(converted, capsys):
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", str(converted), "--samples-per-s", "640", "--ranks", "2", "--preset", "pi05",
                          "--batch-size", "4", "--shuffle", "shard_block", "--measure", "--json"])
    assert run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    index = load_index(converted)
    cams_bytes = sum(index.cameras[c].frame_bytes for c in CAMS)
    assert doc["plan"]["image_bytes_per_sample"] == cams_bytes  # pi05: one frame per camera, all present
    assert doc["plan"]["h2d_image_bytes_per_step_uint8"] == 4 * cams_bytes
    assert doc["measured"]["bytes_read"] == sum(s.bytes for s in index.shards)
    assert doc["measured"]["disk_bytes_per_s"] > 0 and doc["verdicts"]
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        run(ap.parse_args(["plan", str(converted), "--samples-per-s", "1", "--ranks", "64", "--batch-size", "32"]))

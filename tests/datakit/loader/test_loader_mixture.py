"""Weighted mixtures of shard folders (datakit/loader/mixture.py, mixture_dataset.py): the schedule's
proportions, resume on other world sizes, per-source normalisation and padding against numpy on the
source tables, slots and prompts per source, the fps rule."""
import dataclasses
import json
import shutil

import numpy as np
import pyarrow.ipc as ipc
import pytest
import torch

from damage import rehash
from datakit.loader import LoaderConfig, MixtureSource, ShardLoader
from datakit.loader.mixture import SourceOrders, schedule
from datakit.shards.names import FRAMES_NAME, MANIFEST_NAME
from loader_fixtures import shards_b, shards_rgb  # noqa: F401 - session fixtures

def sources(a, b, **b_kw):
    return [MixtureSource(root=str(a), weight=0.7, name="a"),
            MixtureSource(root=str(b), weight=0.3, name="b", slots=("cam.hand", None, "cam.front"), **b_kw)]


def table(folder):
    with open(folder / FRAMES_NAME, "rb") as f:
        return ipc.open_file(f).read_all()


def test_schedule_shares_and_windows_of_four_global_batches():
    w, block, n = np.array([0.8, 0.2]), 24, 20_000
    source, k = schedule(w, block, 5, np.arange(n))
    for s in range(2):
        assert abs((source == s).mean() - w[s]) < 0.005
        assert np.array_equal(k[source == s], np.arange((source == s).sum()))  # each source's own count
    for g in range(n // block - 3):  # every window of 4 global batches: within one sample of its quota
        counts = np.bincount(source[g * block : (g + 4) * block], minlength=2)
        assert np.abs(counts - w * 4 * block).max() <= 1, g
    assert not np.array_equal(source[:block], schedule(w, block, 6, np.arange(block))[0])  # the seed shuffles
    # within a source, its own epochs: the small one wraps and reshuffles, the large one goes on
    orders = SourceOrders(weights=w, block=block, seed=5, sizes=(50_000, 37), mode="random", blocks=(None, None))
    source, local = orders(np.arange(n))
    small, large = local[source == 1], local[source == 0]
    epochs = small[: small.size // 37 * 37].reshape(-1, 37)
    assert all(sorted(e) == list(range(37)) for e in epochs) and not np.array_equal(epochs[0], epochs[1])
    assert np.unique(large).size == large.size
    batched = [orders.schedule(np.arange(p, p + 8)) for p in range(0, 4096, 8)]  # the loader's chunked path
    assert np.array_equal(np.concatenate([s for s, _ in batched]), schedule(w, block, 5, np.arange(4096))[0])
    assert np.array_equal(np.concatenate([k for _, k in batched]), schedule(w, block, 5, np.arange(4096))[1])


def take(loader, steps):
    out = []
    while len(out) < steps:
        for batch in loader:
            out.append(list(zip(batch["source"].tolist(), batch["row"].tolist())))
            if len(out) == steps:
                break
    return out


@pytest.mark.parametrize("world, batch", [(1, 6), (2, 3), (3, 2), (2, 1)])
def test_mixture_resumed_on_another_world_size_continues_the_order(shards_rgb, shards_b, world, batch):  # noqa: F811
    gb, k, more = 6, 7, 12  # 102 samples an epoch: 17 global steps, the resumed part crosses its end
    base = dict(seed=3, num_workers=0, epoch_batch=gb, pin_memory=False)
    mix = sources(shards_rgb, shards_b)  # each loader opens its own, as each rank does
    unbroken = take(ShardLoader(mix, LoaderConfig(batch_size=gb, **base)), k + more)
    first = [ShardLoader(mix, LoaderConfig(batch_size=3, rank=r, world_size=2, **base)) for r in range(2)]
    ranks = [take(loader, k) for loader in first]
    state = first[0].state_dict()
    resumed = [ShardLoader(mix, LoaderConfig(batch_size=batch, rank=r, world_size=world, **base))
               for r in range(world)]
    for loader in resumed:
        loader.load_state_dict(state)
    steps = more * gb // (world * batch)  # (2, 1): 3 micro-batches per global batch
    after = [take(loader, steps) for loader in resumed]
    # the global order: step after step, rank after rank (StepSampler's split)
    order = [x for g in range(k) for r in range(2) for x in ranks[r][g]]
    order += [x for s in range(steps) for r in range(world) for x in after[r][s]]
    assert order == [x for step in unbroken for x in step]
    assert {s for s, _ in order} == {0, 1}


def test_per_source_normalisation_padding_slots_and_prompt(shards_rgb, shards_b):  # noqa: F811
    cfg = LoaderConfig(batch_size=24, seed=1, action_horizon=3, norm="mean_std", num_workers=0, pin_memory=False)
    loader = ShardLoader(sources(shards_rgb, shards_b, prompt="do it"), cfg)
    host = next(iter(ShardLoader(sources(shards_rgb, shards_b, prompt="do it"), cfg)))
    dev = next(loader.device_batches("cpu", steps=1))
    src, rows = host["source"].numpy(), host["row"].numpy()
    assert set(src.tolist()) == {0, 1} and [s.name for s in loader.sources] == ["a", "b"]
    assert loader.dataset.tasks[-1] == "do it" and (host["task_index"].numpy()[src == 1] == 2).all()
    for s, folder, dims in ((0, shards_rgb, (6, 6)), (1, shards_b, (4, 3))):
        t = table(folder)
        stats = json.loads((folder / MANIFEST_NAME).read_text())["stats"]
        ep = t.column("episode_index").to_numpy()
        for part, width, offsets in (("state", dims[0], [0]), ("action", dims[1], [0, 1, 2])):
            col = np.stack(t.column(part).to_numpy(zero_copy_only=False)).astype(np.float64)
            want = []
            for r in rows[src == s]:
                r_ = [r + o if r + o < len(ep) and ep[r + o] == ep[r] else max(np.flatnonzero(ep == ep[r]))
                      for o in offsets]
                x = (col[r_] - np.array(stats[part]["mean"])) / np.maximum(np.array(stats[part]["std"]), 1e-8)
                want.append(np.pad(x, ((0, 0), (0, 6 - width))))
            np.testing.assert_allclose(dev[part][src == s].numpy(), np.array(want), rtol=1e-5, atol=1e-5)
            mask = host[f"{part}_mask"].numpy()[src == s]
            assert mask[:, :width].all() and not mask[:, width:].any()
    # slots per source: b's hand camera fills slot 0, its front camera slot 2, slot 1 is empty for it
    b_only = ShardLoader(str(shards_b), LoaderConfig(batch_size=21, seed=1, action_horizon=3, shuffle="sequential",
                                                     slots=("cam.hand", None, "cam.front"), prune_slots=False,
                                                     num_workers=0, pin_memory=False))
    own = next(iter(b_only))
    keep = host["slot_index"].tolist()
    assert keep == [0, 1, 2]  # source a fills slot 1
    for i in np.flatnonzero(src == 1):
        assert torch.equal(host["images"][i], own["images"][rows[i]])
        assert host["image_mask"][i].tolist() == [True, False, True]
    loader.close()
    b_only.close()
    # a source with fewer slots than another: its items' last slot is empty, kept (no pruning) as zeros
    short = [MixtureSource(root=str(shards_rgb), weight=0.5, name="a"),
             MixtureSource(root=str(shards_b), weight=0.5, name="b", slots=("cam.hand", "cam.front"))]
    batch = next(iter(ShardLoader(short, dataclasses.replace(cfg, prune_slots=False))))
    of_b = batch["source"] == 1
    assert of_b.any() and batch["images"].shape[1] == 3
    assert not batch["image_mask"][of_b, 2].any() and not batch["images"][of_b, 2].any()
    assert batch["image_mask"][of_b, :2].all()


def test_mixture_refuses_other_fps_unless_set_and_reads_at_the_set_rate(shards_rgb, shards_b, tmp_path):  # noqa: F811
    fast = tmp_path / "fast"
    shutil.copytree(shards_b, fast)
    manifest = json.loads((fast / MANIFEST_NAME).read_text())
    manifest["fps"] = 20.0
    (fast / MANIFEST_NAME).write_text(json.dumps(manifest))
    rehash(fast)
    cfg = dict(batch_size=24, seed=1, action_horizon=3, num_workers=0, pin_memory=False)
    with pytest.raises(ValueError, match=f"{shards_rgb} and {fast} have different fps \\(10 and 20\\)"):
        ShardLoader(sources(shards_rgb, fast), LoaderConfig(**cfg))
    loader = ShardLoader(sources(shards_rgb, fast), LoaderConfig(fps=10, boundary="skip", **cfg))
    batch = next(iter(loader))
    assert (batch["source"] == 1).any()
    action = np.stack(table(fast).column("action").to_numpy(zero_copy_only=False))
    for i in np.flatnonzero(batch["source"].numpy() == 1):  # the 20 fps source: every second row
        r = int(batch["row"][i])
        np.testing.assert_array_equal(batch["action"][i, :, :3].numpy(), action[[r, r + 2, r + 4]])
    loader.close()
    with pytest.raises(ValueError, match=r"share the name\(s\) \['out'\]"):  # two folders named out/
        ShardLoader([MixtureSource(root=str(shards_rgb), weight=1), MixtureSource(root=str(shards_b), weight=1)],
                    LoaderConfig(**cfg))
    mapped = ShardLoader({str(shards_rgb): 1.0, str(shards_b): 1.0}, LoaderConfig(**cfg))
    assert [s.name for s in mapped.sources] == [str(shards_rgb), str(shards_b)]  # a mapping: the paths
    mapped.close()


def test_plan_of_a_mixture_weights_its_sources(shards_rgb, shards_b, capsys):  # noqa: F811
    import argparse

    from datakit.commands.plan.command import add_parser, run
    from datakit.loader.throughput.model import plan_throughput
    from datakit.shards.index import load_frames, load_index

    cfg = LoaderConfig(batch_size=4, action_horizon=3)
    alone = [plan_throughput(load_index(f), load_frames(f), cfg, samples_per_s=100.0, ranks=2)
             for f in (shards_rgb, shards_b)]
    parser = add_parser(argparse.ArgumentParser().add_subparsers())
    args = parser.parse_args([str(shards_rgb), str(shards_b), "--weights", "3,1", "--samples-per-s", "100", "--ranks",
                              "2", "--batch-size", "4", "--action-horizon", "3", "--json"])
    assert run(args) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert [s["weight"] for s in plan["sources"]] == [0.75, 0.25]
    assert plan["sources"][1]["plan"]["samples_per_s"] == 25.0
    want = 0.75 * alone[0].bytes_per_sample + 0.25 * alone[1].bytes_per_sample
    assert plan["bytes_per_sample"] == pytest.approx(want)
    assert plan["read_bytes_per_s_per_node"] == pytest.approx(100.0 * want)
    assert plan["working_set_bytes_per_node"] == sum(p.working_set_bytes_per_node for p in alone)
    with pytest.raises(ValueError, match="--weights gives 1 weights for 2 folders"):
        run(parser.parse_args([str(shards_rgb), str(shards_b), "--weights", "1", "--samples-per-s", "1"]))

"""`datakit.lerobot.ShardLeRobotDataset` against stock LeRobotDataset (lerobot 0.6.1, its own venv).

For every index of a small v3.0 and a small v2.1 dataset (cameras of two sizes, a blank camera,
three tasks), the item equals LeRobotDataset's under ACT's, Pi0.5's and diffusion's
delta_timestamps as lerobot-train resolves them (return_uint8, as lerobot-train asks): every
key, dtype, shape, value and pad mask; images exactly (the conversion and LeRobot decode the same
AV1 frames to the same bytes). LeRobot 0.6.1 reads v3.0 only: the v2.1 oracle is LeRobot's own
v2.1 -> v3.0 converter, then LeRobotDataset. Meta fields equal; statistics equal LeRobot's
algorithm run on LeRobotDataset's frames (float32 rounding) and the source's stats.json within
float32 accumulation. Positive controls: a one-frame shift, and statistics not aggregated per
episode, fail the same checks. Skipped without /tmp/lerobot-venv/.ready.
"""
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from datakit.lerobot import ShardLeRobotDataset
from datakit.lerobot.stats import lerobot_stats

LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ORACLE = Path(__file__).resolve().parents[3] / "tools" / "lerobot_oracle" / "lerobot_oracle.py"
CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
POLICIES = ("act", "pi05", "diffusion")
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason="no lerobot venv at /tmp/lerobot-venv")


def _oracle(*args: str) -> None:
    subprocess.run([str(LEROBOT_PY), str(ORACLE), *args], check=True, capture_output=True,
                   env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=600)


@pytest.fixture(scope="module", params=["v3.0", "v2.1"])
def oracle(request, tmp_path_factory):
    """(shard folder, LeRobot items npz, LeRobot meta json, LeRobot stats npz) of one tiny dataset."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    if not (LEROBOT_PY.parents[1] / ".ready").exists():
        pytest.skip("no lerobot venv at /tmp/lerobot-venv")
    root = tmp_path_factory.mktemp(request.param)
    src = make_lerobot_dataset(root / "src", version=request.param, episode_lengths=(5, 7, 4), height=32, width=64,
                               camera_sizes={CAMS[1]: (48, 64)}, cameras=CAMS, blank_cameras=(CAMS[2],),
                               tasks=("pick", "place", "push"))
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False))
    v21 = ["--v21", str(root / "v30")] if request.param == "v2.1" else []
    _oracle("items", str(src), str(root / "items.npz"), "--all", "--uint8", "--backend", "pyav",
            "--policies", *POLICIES, *v21)
    _oracle("meta", str(src), str(root / "meta.json"), "--backend", "pyav", *v21)
    return out, dict(np.load(root / "items.npz")), json.loads((root / "meta.json").read_text()), \
        dict(np.load(root / "meta.npz"))


def mismatches(ds: ShardLeRobotDataset, want: dict, prefix: str, shift: int = 0) -> list[str]:
    """(index, key, why) of every difference between ds[i + shift] and LeRobot's item i."""
    bad = []
    for i in range(len(ds)):
        got = ds[min(i + shift, len(ds) - 1)]
        keys = {k.split("/", 2)[2] for k in want if k.startswith(f"{prefix}/{i}/")}
        if keys != set(got):
            bad.append(f"{i}: keys {sorted(keys ^ set(got))}")
            continue
        for k in keys:
            w = want[f"{prefix}/{i}/{k}"]
            if k == "task":
                bad += [f"{i}/{k}"] if str(w) != got[k] else []
                continue
            g = got[k].numpy()
            if g.dtype != w.dtype or g.shape != w.shape or not np.array_equal(g, w):
                bad.append(f"{i}/{k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}")
    return bad


@needs_lerobot
@pytest.mark.parametrize("policy", POLICIES)
def test_items_equal_lerobot_dataset(oracle, policy):
    out, want, _, _ = oracle
    delta = json.loads(str(want[f"{policy}/delta"]))
    ds = ShardLeRobotDataset(out, delta_timestamps=delta, return_uint8=True)
    assert len(ds) == 16
    assert mismatches(ds, want, policy) == []
    assert any(want[f"{policy}/{i}/action_is_pad"].any() for i in range(len(ds)))  # episode ends were padded
    # positive control: the same check sees a one-frame shift
    assert len(mismatches(ds, want, policy, shift=1)) >= len(ds) - 3


@needs_lerobot
def test_float_items_are_lerobots_scaling(oracle):
    out, want, _, _ = oracle
    u8 = ShardLeRobotDataset(out, return_uint8=True)[3]
    f32 = ShardLeRobotDataset(out)[3]  # LeRobotDataset's default: float in [0, 1]
    for cam in CAMS:
        assert f32[cam].dtype == torch.float32
        assert torch.equal(f32[cam], u8[cam].float() / 255)


@needs_lerobot
def test_meta_equals_lerobot_dataset(oracle):
    out, _, meta, _ = oracle
    ds = ShardLeRobotDataset(out)
    m = ds.meta
    assert m.fps == meta["fps"] and m.robot_type == meta["robot_type"]
    assert m.camera_keys == meta["camera_keys"] and m.video_keys == meta["video_keys"]
    assert m.task_list == meta["tasks"]
    try:  # LeRobot's pandas task frame, where pandas is installed (LeRobot's environment)
        import pandas  # noqa: F401
        assert m.tasks.index.tolist() == meta["tasks"] and m.tasks["task_index"].tolist() == [0, 1, 2]
    except ImportError:
        pass
    assert list(m.episodes["dataset_from_index"]) == meta["dataset_from_index"]
    assert list(m.episodes["dataset_to_index"]) == meta["dataset_to_index"]
    assert list(m.episodes["tasks"]) == meta["tasks_per_episode"]
    assert (m.total_episodes, m.total_frames, ds.num_frames, ds.num_episodes) == (
        meta["total_episodes"], meta["total_frames"], meta["num_frames"], meta["num_episodes"])
    assert m.has_language_columns == meta["has_language_columns"]
    # LeRobot's v2.1 -> v3.0 converter adds "fps" to non-video features; the rest is the source's
    keep = ("dtype", "shape", "names", "info")
    assert {k: {f: v[f] for f in keep if f in v} for k, v in m.features.items()} == \
        {k: {f: v[f] for f in keep if f in v} for k, v in meta["features"].items()}


@needs_lerobot
def test_stats_as_lerobot_computes_them(oracle):
    out, _, _, stats = oracle
    ds = ShardLeRobotDataset(out)
    for key, st in ds.meta.stats.items():
        for name, v in st.items():
            w = stats[f"stats/{key}/{name}"]
            assert v.shape == w.shape, (key, name)
            # the same algorithm on the same bytes (images decode identically): float32 rounding only
            assert np.allclose(v, w, rtol=1e-5, atol=1e-6), (key, name, v, w)
    # the source's stats.json (float64 over all frames; no quantiles): equal within float32 accumulation
    for key in ("observation.state", "action"):
        for name in ("mean", "std", "min", "max"):
            assert np.allclose(ds.meta.stats[key][name], stats[f"meta_stats/{key}/{name}"], rtol=1e-5, atol=1e-6)
    # positive control: statistics over the whole set at once (not per episode, then aggregated)
    idx = ds.reader.index
    flat = lerobot_stats({"action": ds._action}, [(0, idx.num_frames)], {})
    assert not np.allclose(flat["action"]["q01"], stats["stats/action/q01"], rtol=1e-5, atol=1e-6)


def test_episodes_subset_and_pickling(tmp_path):
    """LeRobot's episode filter semantics (len, absolute_to_relative_idx) and DataLoader workers."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    src = make_lerobot_dataset(tmp_path / "src", version="v3.0", episode_lengths=(5, 7, 4), height=32, width=64,
                               cameras=CAMS[:1], blank_cameras=())
    convert(src, tmp_path / "out", ConvertConfig(workers=1, progress=False))
    full = ShardLeRobotDataset(tmp_path / "out", delta_timestamps={"action": [0, 0.1, 0.2]}, return_uint8=True)
    ds = ShardLeRobotDataset(tmp_path / "out", episodes=[2, 0], delta_timestamps={"action": [0, 0.1, 0.2]},
                             stats=full.meta.stats, return_uint8=True)
    assert len(ds) == 9 and ds.num_episodes == 2 and ds.episodes == [2, 0]
    assert ds.absolute_to_relative_idx == {**{r: r for r in range(5)}, **{12 + j: 5 + j for j in range(4)}}
    assert int(ds[5]["index"]) == 12 and torch.equal(ds[5]["action"], full[12]["action"])
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2)
    batch = next(iter(loader))
    assert batch[CAMS[0]].shape == (3, 3, 32, 64) and batch["action"].shape == (3, 3, 6)
    assert torch.equal(batch["index"], torch.tensor([0, 1, 2])) and len(batch["task"]) == 3
    with pytest.raises(ValueError, match="not multiples of 1/fps"):
        ShardLeRobotDataset(tmp_path / "out", delta_timestamps={"action": [0, 0.05]}, stats=full.meta.stats)
    with pytest.raises(ValueError, match="not in"):
        ShardLeRobotDataset(tmp_path / "out", episodes=[7], stats=full.meta.stats)


def test_remote_root_reads_like_the_local_folder(converted, uploaded, tmp_path):
    """An s3:// shard root (moto, real HTTP) through the download cache, as ShardLoader reads it:
    every item equal to the local folder's, in the main process and in DataLoader workers."""
    pytest.importorskip("s3fs")
    delta = {"action": [0, 0.1, 0.2], "observation.state": [-0.1, 0]}
    local = ShardLeRobotDataset(converted, delta_timestamps=delta, return_uint8=True)
    remote = ShardLeRobotDataset(uploaded, delta_timestamps=delta, return_uint8=True, cache_dir=tmp_path / "cache",
                                 cache_bytes=1 << 30, stats=local.meta.stats)
    assert len(remote) == len(local) and remote.meta.features == local.meta.features
    for i in range(len(local)):
        a, b = local[i], remote[i]
        assert all(a[k] == b[k] if k == "task" else torch.equal(a[k], b[k]) for k in a), i
    got = next(iter(torch.utils.data.DataLoader(remote, batch_size=len(remote), num_workers=2)))
    assert torch.equal(got["observation.images.top"], torch.stack([local[i]["observation.images.top"]
                                                                   for i in range(len(local))]))


def test_statistics_are_cached_per_conversion(tmp_path, monkeypatch):
    """The second dataset of a conversion reads the statistics the first computed; a damaged cache
    entry is computed again; another conversion does not get them."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.lerobot import dataset as dataset_mod
    from datakit.synth import make_lerobot_dataset

    outs = []
    for n, lengths in enumerate(((5, 4), (6, 4))):
        src = make_lerobot_dataset(tmp_path / f"src{n}", version="v3.0", episode_lengths=lengths, height=32, width=64,
                                   cameras=CAMS[:1], blank_cameras=())
        convert(src, tmp_path / f"out{n}", ConvertConfig(workers=1, progress=False))
        outs.append(tmp_path / f"out{n}")
    cache = tmp_path / "stats"
    first = ShardLeRobotDataset(outs[0], stats_dir=cache).meta.stats
    (entry,) = cache.glob("*.json")
    calls = []
    real = dataset_mod.lerobot_stats
    monkeypatch.setattr(dataset_mod, "lerobot_stats", lambda *a: calls.append(1) or real(*a))
    again = ShardLeRobotDataset(outs[0], stats_dir=cache).meta.stats
    assert calls == [] and all(np.allclose(first[k][s], again[k][s]) for k in first for s in first[k])
    entry.write_text("{not json")
    ShardLeRobotDataset(outs[0], stats_dir=cache)
    assert calls == [1] and json.loads(entry.read_text())
    other = ShardLeRobotDataset(outs[1], stats_dir=cache).meta.stats
    assert calls == [1, 1] and other["action"]["count"][0] == 10

"""Mixtures of any camera sizes (issue 35, item 4): `data.shards = {"v30" = 0.7, "droid" = 0.3}` where
slot 0's camera is 120x160 in one source and 90x160 (DROID's 16:9) in the other trains, through the
per-slot views and device resize that one folder with cameras of different sizes uses. Before the fix
the mixture was refused ("store slot 0's camera at frame shapes (120, 160, 3) and (90, 160, 3);
convert both to one size").

- The loader: a mixed batch splits slot 0 by size (`images.0.<g>` + `image_items.0.<g>`), and after
  the normaliser every item's view equals the resize of its own stored frame, read back with
  `datakit.reader` (the oracle); a batch with a failed shard keeps each group's surviving items at
  their new rows, its image keys in buffer order.
- trainkit: a tiny Pi0.5 run on the 0.7 / 0.3 mixture trains with falling loss and logs each
  source's loss; the sources keep their own slots (a source naming its cameras per slot still works).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainkit_harness import tiny_config

pytestmark = pytest.mark.timeout(300)

# (camera -> (height, width)) per source; PNG columns (no codec): quick to make, exact to read back
V30 = {"observation.images.front": (120, 160), "observation.images.wrist": (96, 128)}
DROID = {"observation.images.exterior_1_left": (90, 160), "observation.images.wrist_left": (90, 160)}


def _make(root: Path, name: str, cams: dict[str, tuple[int, int]], lengths: tuple[int, ...], seed: int) -> Path:
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    (h, w), *_ = cams.values()
    src = make_lerobot_dataset(root / f"{name}_src", episode_lengths=lengths, height=h, width=w, cameras=tuple(cams),
                               image_cameras=tuple(cams), blank_cameras=(), camera_sizes=cams, seed=seed)
    convert(src, root / name, ConvertConfig(workers=1, progress=False, layout="rgb"))
    return root / name


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mix_sizes")
    return _make(root, "v30", V30, (20, 16, 14), 0), _make(root, "droid", DROID, (18, 15), 3)


def _mixture(v30: Path, droid: Path, **kw):
    from datakit.loader import LoaderConfig, MixtureSource
    from datakit.loader.mixture_dataset import MixtureDataset

    cfg = LoaderConfig(frame_offsets=(0,), action_horizon=4, batch_size=16, resize=(24, 24), resize_mode="pad",
                       image_dtype="float32", prune_slots=False, **kw)
    return MixtureDataset((MixtureSource(root=str(v30), weight=0.7, name="v30"),
                           MixtureSource(root=str(droid), weight=0.3, name="droid")), cfg)


def test_each_items_view_is_the_resize_of_its_own_stored_frame(sources):
    from datakit.loader.normalise import Normaliser
    from datakit.loader.resize import resize_view
    from datakit.reader import open_shards

    v30, droid = sources
    ds = _mixture(v30, droid)
    batch = ds.read_batch(list(range(16)))
    source = batch["source"].numpy()
    assert {0, 1} <= set(source.tolist())  # both sources in the batch: slot 0 split by size
    assert tuple(batch["images.0.0"].shape[2:]) == (120, 160, 3) and tuple(batch["images.0.1"].shape[2:]) == (90, 160, 3)
    assert sorted(batch["image_items.0.0"].tolist() + batch["image_items.0.1"].tolist()) == list(range(16))
    norm = Normaliser.from_sources(ds.indexes, ds.cfg, ds.state_dim, ds.action_dim)
    out = norm(batch)
    images = out["images"]
    assert tuple(images.shape) == (16, 2, 1, 3, 24, 24) and not any(k.startswith("image_items") for k in out)
    readers = [open_shards(v30), open_shards(droid)]
    cams = [list(V30), list(DROID)]
    for i in range(16):
        s = int(source[i])
        for k in range(2):
            frame = readers[s].read_frame(int(batch["episode_index"][i]), int(batch["frame_index"][i]), cams[s][k])
            x = resize_view(torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None], (24, 24), "pad")
            want = x[0] * norm.image_scale.view(3, 1, 1) + norm.image_bias.view(3, 1, 1)
            torch.testing.assert_close(images[i, k, 0], want, atol=1e-5, rtol=0)
    ds.close()


def test_without_a_resize_the_sizes_are_named_in_one_line(sources):
    from datakit.loader.normalise import Normaliser

    v30, droid = sources
    ds = _mixture(v30, droid)
    cfg = ds.cfg.__class__(**{**ds.cfg.__dict__, "resize": None})
    batch = ds.read_batch(list(range(16)))
    with pytest.raises(ValueError, match=r"sizes 120x160, 90x160: set resize"):
        Normaliser.from_sources(ds.indexes, cfg, ds.state_dim, ds.action_dim)(batch)
    ds.close()


def test_a_failed_shard_keeps_each_groups_items_at_their_new_rows():
    from datakit.loader.mixture_dataset import drop_failed_groups

    b = 5
    front = torch.arange(3 * 2).view(3, 1, 2).to(torch.uint8)  # items 0, 2, 4
    side = torch.arange(2 * 3).view(2, 1, 3).to(torch.uint8) + 100  # items 1, 3
    batch = {"images.0.0": front, "images.0.1": side, "images.1": torch.zeros(b, 1, 4, dtype=torch.uint8),
             "image_items.0.0": torch.tensor([0, 2, 4]), "image_items.0.1": torch.tensor([1, 3]),
             "row": torch.arange(b), "slot_index": torch.tensor([0, 1])}
    out = drop_failed_groups(batch, np.array([True, True, False, False, True]))  # items 2 and 3 failed
    assert [k for k in out if k.startswith("images")] == ["images.0.0", "images.0.1", "images.1"]
    assert out["image_items.0.0"].tolist() == [0, 2] and out["image_items.0.1"].tolist() == [1]
    assert out["images.0.0"].tolist() == front[[0, 2]].tolist() and out["images.0.1"].tolist() == side[[0]].tolist()
    assert out["row"].tolist() == [0, 1, 4] and int(out["num_skipped"]) == 2


@pytest.mark.parametrize("form", ["shards_table", "sources_with_slots"])
def test_a_tiny_pi05_run_on_a_mixture_of_camera_sizes_trains_with_falling_loss(sources, tmp_path, form):
    from trainkit.train import run

    v30, droid = sources
    if form == "shards_table":  # the short form: each source's cameras in index order
        data = f'data.shards={{"{v30}" = 0.7, "{droid}" = 0.3}}'
    else:  # each source names its own cameras per slot (DROID's wrist first); loader workers read them
        data = (f'data.sources=[{{shards = "{v30}", weight = 0.7}}, {{shards = "{droid}", weight = 0.3, '
                f'slots = ["{list(DROID)[1]}", "{list(DROID)[0]}"]}}]')
    out = tmp_path / "run"
    steps = 16
    workers = "data.num_workers=2" if form == "sources_with_slots" else "data.num_workers=0"
    result = run(tiny_config(v30, out, data, workers, f"train.steps={steps}", "output.log_every=1",
                             "parallel.fsdp=none", "parallel.ac_stride={}", "optim.schedule=constant",
                             "optim.warmup_steps=0"))
    losses = [result.losses[s] for s in range(steps)]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    intervals = [r for r in rows if r["kind"] == "interval"]
    assert all(r["samples/v30"] + r["samples/droid"] == 4 for r in intervals)
    assert set(result.summary["source_loss"]) == {"v30", "droid"}
    assert sum(r["samples/droid"] for r in intervals) > 0 and any("loss/droid" in r for r in intervals)


def test_a_first_source_stored_at_the_models_size_keeps_the_resize_the_second_needs(sources, tmp_path):
    """The family's loader preset drops the device resize for a folder stored at the model's input
    size; in a mixture it is kept when any source needs it (before the fix: the first source's word)."""
    from trainkit.train import run

    v30, _ = sources
    sim = _make(tmp_path, "sim", {"observation.images.top": (64, 64)}, (12, 10), 5)
    result = run(tiny_config(sim, tmp_path / "run", f'data.shards={{"{sim}" = 0.5, "{v30}" = 0.5}}', "train.steps=2",
                             "model.image_size=64", "parallel.fsdp=none", "parallel.ac_stride={}"))
    assert sorted(result.losses) == [0, 1] and all(math.isfinite(x) for x in result.losses.values())

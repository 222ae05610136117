"""The three families train on the held-out-like dataset of issue 26 as it is: LeRobot v3.0, a 120x160
scene camera, a 96x128 wrist camera and a blank one, converted without --resize.

Each family's loader preset resizes every view on the device from its own stored size to the model's
input (Pi0.5: LeRobot's resize-with-pad; GR00T: N1.7's bicubic to 256x256, centre crop, back;
DreamZero: each view to its canvas cell before tiling), so `trainkit run` of pi05_tiny, gr00t_tiny and
dreamzero_tiny trains a few steps with finite losses, and the batch the model takes holds each view as
an independent resize of the stored frames says (tests/datakit/loader/test_loader_camera_sizes.py holds the loader
to the same oracles).
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loader_fixtures import CAMS, SIZES, sizes_rgb  # noqa: F401 - fixture
from trainkit_harness import ROOT, tiny_config

from datakit.reader import open_shards

CONFIGS = ROOT / "trainkit" / "configs"
FAST = ("train.steps=3", "output.log_every=1", "parallel.fsdp=none", "parallel.ac_stride={}", "train.micro_batch=2")


@pytest.mark.parametrize("config,sets", [
    ("pi05_tiny", ()), ("pi05_tiny", ("data.h2d_dtype=float32", "data.prune_slots=false")),
    ("gr00t_tiny", ()), ("dreamzero_tiny", ())])
def test_each_family_trains_on_cameras_of_different_sizes(sizes_rgb, tmp_path, config, sets):
    from trainkit.train import run

    _, out = sizes_rgb
    result = run(tiny_config(out, tmp_path / "run", *FAST, *sets, config=CONFIGS / f"{config}.toml"))
    assert sorted(result.losses) == [0, 1, 2] and all(math.isfinite(v) for v in result.losses.values())


def test_the_pi05_model_batch_holds_lerobots_resize_of_each_view(sizes_rgb):
    """The device batch Pi0.5 takes: each kept view resized with pad to 16x16 from its own size and
    scaled to [-1, 1], against F.interpolate of the stored frames (LeRobot's definition, written here)."""
    from trainkit.config import load_config
    from trainkit.data import TrainData, read_run_shards
    from trainkit.models import build_config, family

    _, out = sizes_rgb
    cfg = load_config(CONFIGS / "pi05_tiny.toml", [f"data.shards={out}", "data.num_workers=0"])
    fam, model_cfg = family("pi05"), build_config("pi05", "tiny", cfg.model.overrides)
    shards = read_run_shards(cfg.data, fam.max_slots(model_cfg))
    data = TrainData(cfg.data, shards, fam, model_cfg, seed=0, rank=0, world_size=1, micro_batch=3,
                     device=torch.device("cpu"), image_dtype=torch.float32)
    step = next(data.batches())
    images = step.model.images  # (B, K, 3, 16, 16)
    assert images.shape == (3, 2, 3, 16, 16) and data.cfg.resize_mode == "pad"
    reader = open_shards(out)
    for i, row in enumerate(step.rows.tolist()):
        for j, cam in enumerate(CAMS[:2]):
            x = torch.from_numpy(np.array(reader.read_raw(row, cam))).permute(2, 0, 1)[None].float()
            h, w = SIZES[cam]
            ratio = max(w / 16, h / 16)
            rh, rw = int(h / ratio), int(w / ratio)  # 12x16 for both 4:3 cameras
            y = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0, 255)
            y = F.pad(y, ((16 - rw) // 2, 16 - rw - (16 - rw) // 2, (16 - rh) // 2, 16 - rh - (16 - rh) // 2))
            want = y[0] * (torch.tensor(1.0) / 127.5) - 1.0  # mean 0.5, std 0.5: [0, 255] -> [-1, 1]
            assert torch.allclose(images[i, j], want, atol=1e-6), (row, cam)
            assert (images[i, j, :, :2] == -1).all()  # the padding rows are black
    shards.close()

"""A generated 3-camera dataset (DROID's wrist + two exterior views) converted to shards, for the
DreamZero tests: PNG image columns (no video codec), lossless, so every frame is known exactly from
the generator (`datakit.synth.lerobot.synth_frame`): the tiling test's oracle.

Import the fixture from here (`from dreamzero_fixtures import shards_3cam`).
"""
from pathlib import Path

import numpy as np
import pytest

CAMS3 = ("observation.images.wrist", "observation.images.exterior_1", "observation.images.exterior_2")
LENGTHS3 = (40, 34)
VIEW_HW = (32, 64)  # the tiny preset's view (the generator's smallest); its canvas is 64x128


def source_frame(episode: int, frame: int, camera: int) -> np.ndarray:
    """(H, W, 3) uint8 frame `frame` of `episode` from camera `camera` of CAMS3, as generated."""
    from datakit.synth.lerobot import camera_seed, synth_frame

    start = int(sum(LENGTHS3[:episode]))
    return synth_frame(start + frame, *VIEW_HW, camera_seed(0, camera, episode))


def build_3cam(root: Path) -> Path:
    """The 3-camera dataset generated under `root` and converted: its shard folder."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=LENGTHS3, height=VIEW_HW[0],
                               width=VIEW_HW[1], cameras=CAMS3, image_cameras=CAMS3, blank_cameras=(), state_dim=6,
                               action_dim=7)
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False))
    return out


@pytest.fixture(scope="session")
def shards_3cam(tmp_path_factory) -> Path:
    return build_3cam(tmp_path_factory.mktemp("dreamzero_3cam"))

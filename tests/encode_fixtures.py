"""Tiny encoders and a small shard folder for the `datakit encode` tests (nothing downloaded).

- `encoders`: datakit/encode/tiny.py's (`python -m datakit.encode.tiny OUT`, the documented smoke
  test): AutoencoderKLWan Wan2.1- and Wan2.2-style, a UMT5EncoderModel with a word-level tokenizer,
  a CLIPVisionModel, every weight (norms included) drawn at random from a fixed seed;
- `source`: 4 episodes of one 32x64 PNG camera converted into 3 shards.
Import the fixtures from here (`from encode_fixtures import encoders, source`).
"""
from __future__ import annotations

from pathlib import Path

import pytest

LENGTHS = (13, 9, 11, 14)  # 5-frame clips: 2 + 1 + 2 + 2 at stride 1
CAMERA = "observation.images.top"


@pytest.fixture(scope="session")
def encoders(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    from datakit.encode.tiny import make_tiny_encoders

    return make_tiny_encoders(tmp_path_factory.mktemp("encoders"))


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> Path:
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("encode_src")
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=LENGTHS, height=32, width=64,
                               cameras=(CAMERA,), image_cameras=(CAMERA,), blank_cameras=(), state_dim=3, action_dim=2,
                               tasks=("pick up the cube", "open the drawer", "pick up a drawer"))
    out = root / "shards"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=20_000))
    return out

"""Shard folders for the loader tests, built once per session with the real pipeline:
`datakit.synth.make_lerobot_dataset` (real AV1 videos) -> `datakit.convert.convert`.

Import the fixtures from here (`from test_loader_fixtures import shards_rgb`); the one test
below checks the fixture against the contract the loader relies on.
"""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from damage import rehash
from datakit.shards.index import FRAMES_NAME, MANIFEST_NAME, OFFSET_PREFIX, load_frames, write_frames

LENGTHS = (24, 31, 17, 9)
CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")


# Prebuilt folders (`bench/bench_loader.py --device-fixture DIR`) for machines without a
# video decoder, e.g. the GPU machine: DIR/rgb/out and DIR/nv12/out.
PREBUILT = os.environ.get("DATAKIT_LOADER_FIXTURES")


def build(root: Path, layout: str) -> Path:
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=LENGTHS, height=32, width=64,
                               cameras=CAMS, blank_cameras=(CAMS[2],))
    out = root / "out"
    # a small shard size gives several shards, so reads and orders cross shard boundaries
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=400_000, layout=layout))
    return out


# The held-out-like case of issue 26: a v3.0 dataset whose cameras differ in size (a 120x160 scene
# camera, a 96x128 wrist camera) and a blank one, converted as it is (no --resize).
SIZES = {CAMS[0]: (120, 160), CAMS[1]: (96, 128), CAMS[2]: (120, 160)}


def build_sizes(root: Path, layout: str = "rgb") -> tuple[Path, Path]:
    """(source, shards) of the mixed-size dataset."""
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    src = make_lerobot_dataset(root / "src", version="v3.0", episode_lengths=LENGTHS, height=SIZES[CAMS[0]][0],
                               width=SIZES[CAMS[0]][1], cameras=CAMS, blank_cameras=(CAMS[2],),
                               camera_sizes={CAMS[1]: SIZES[CAMS[1]]})
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=400_000, layout=layout))
    return src, out


@pytest.fixture(scope="session")
def sizes_rgb(tmp_path_factory) -> tuple[Path, Path]:
    """(source dataset, shards) with cameras of different sizes: rgb shards."""
    return build_sizes(tmp_path_factory.mktemp("loader_sizes_rgb"), "rgb")


@pytest.fixture(scope="session")
def sizes_nv12(tmp_path_factory) -> tuple[Path, Path]:
    """The same, nv12 shards."""
    return build_sizes(tmp_path_factory.mktemp("loader_sizes_nv12"), "nv12")


@pytest.fixture(scope="session")
def shards_rgb(tmp_path_factory) -> Path:
    if PREBUILT:
        return Path(PREBUILT) / "rgb" / "out"
    return build(tmp_path_factory.mktemp("loader_rgb"), "rgb")


@pytest.fixture(scope="session")
def shards_nv12(tmp_path_factory) -> Path:
    if PREBUILT:
        return Path(PREBUILT) / "nv12" / "out"
    return build(tmp_path_factory.mktemp("loader_nv12"), "nv12")


@pytest.fixture(scope="session")
def shards_mixed(shards_rgb, tmp_path_factory) -> Path:
    """The rgb folder with per-episode slots varied: episode 1 has `top` blank, episode 3
    has no `wrist` video at all (offsets -1, slot missing)."""
    return with_missing_cameras(shards_rgb, tmp_path_factory.mktemp("loader_mixed") / "out")


@pytest.fixture(scope="session")
def shards_mixed_nv12(shards_nv12, tmp_path_factory) -> Path:
    """The same variation of the nv12 folder."""
    return with_missing_cameras(shards_nv12, tmp_path_factory.mktemp("loader_mixed_nv12") / "out")


def with_missing_cameras(src: Path, out: Path) -> Path:
    """A copy of shard folder `src` in `out` whose episode 1 has `top` blank and episode 3 no `wrist`."""
    shutil.copytree(src, out)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["episodes"][1]["camera_status"][CAMS[0]] = "blank"
    manifest["episodes"][3]["camera_status"][CAMS[1]] = "missing"
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    table = load_frames(out)
    col = OFFSET_PREFIX + CAMS[1]
    off = table.column(col).to_numpy().copy()
    off[table.column("episode_index").to_numpy() == 3] = -1
    table = table.set_column(table.schema.get_field_index(col), col, pa.array(off))
    (out / FRAMES_NAME).unlink()
    write_frames(out / FRAMES_NAME, table)
    rehash(out)  # readers refuse index files that checksums.json does not record
    return out


@pytest.fixture(scope="session")
def shards_b(tmp_path_factory):
    """A second, smaller dataset for mixtures with `shards_rgb`: other camera names, 4 state and 3
    action channels, one task."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("mix_b")
    src = make_lerobot_dataset(root / "src", episode_lengths=(12, 9), height=32, width=64,
                               cameras=("cam.front", "cam.hand"), blank_cameras=(), state_dim=4, action_dim=3,
                               tasks=("stack the blocks",), seed=1)
    convert(src, root / "out", ConvertConfig(workers=1, progress=False, layout="rgb"))
    return root / "out"


def test_fixture_meets_the_contract(shards_rgb):
    from datakit.reader import open_shards

    r = open_shards(shards_rgb)
    assert r.index.num_shards >= 2 and r.index.num_frames == sum(LENGTHS)
    assert [e.camera_status[CAMS[2]] for e in r.index.episodes] == ["blank"] * len(LENGTHS)
    # frames of one episode are frame-major and increasing in their shard
    off = r.offsets[CAMS[0]][: LENGTHS[0]]
    assert np.all(np.diff(off) > 0)

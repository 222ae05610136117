"""Shared set-up of the `datakit doctor` tests: pristine generated datasets (LeRobot v2.1 / v3.0,
raw DROID; real H.264 / AV1), generated once per session and copied by each test that damages
one, and small helpers that plant defects and read the report."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import source_paths
from datakit.commands.doctor import main
from datakit.synth import make_droid_dataset, make_lerobot_dataset, synth_frame
from datakit.synth.lerobot import camera_seed


H, W, FPS = 64, 96, 10
LENGTHS = (10, 12, 14)
CAMS = ("observation.images.top", "observation.images.wrist")
TOP = CAMS[0]


@pytest.fixture(scope="session")
def bases(tmp_path_factory) -> dict[str, Path]:
    """Pristine datasets, generated once; each test copies the one it damages."""
    root = tmp_path_factory.mktemp("doctor-bases")
    common = dict(episode_lengths=LENGTHS, cameras=CAMS, blank_cameras=(), height=H, width=W, fps=FPS)
    return {
        "v2.1": make_lerobot_dataset(root / "v21", version="v2.1", codec="h264", **common),
        "v3.0": make_lerobot_dataset(root / "v30", version="v3.0", codec="av1", **common),
        "droid": make_droid_dataset(root / "droid", episode_lengths=(10, 12), height=H, width=W, codec="h264"),
    }


@pytest.fixture
def dataset(bases, tmp_path):
    def copy(name: str) -> Path:
        return Path(shutil.copytree(bases[name], tmp_path / name))
    return copy


def doctor(src: Path, *args: str) -> tuple[int, dict]:
    out = src.parent / f"{src.name}-doctor.json"
    rc = main([str(src), "--no-progress", "--workers", "1", "--json", str(out), *args])
    return rc, json.loads(out.read_text())


def of_kind(report: dict, kind: str) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == kind]


def v2_video(root: Path, episode: int, cam: str = TOP) -> Path:
    return root / source_paths.LEROBOT_V2_VIDEO_PATH.format(episode_chunk=0, video_key=cam, episode_index=episode)


def v2_table(root: Path, episode: int) -> Path:
    return root / source_paths.LEROBOT_V2_DATA_PATH.format(episode_chunk=0, episode_index=episode)


def frames_of(episode: int, n: int, cam_index: int = 0) -> list[np.ndarray]:
    start = sum(LENGTHS[:episode])
    return [synth_frame(start + i, H, W, camera_seed(0, cam_index, episode)) for i in range(n)]


def set_column(path: Path, name: str, values) -> None:
    """Replace one column of a parquet file, keeping its type and the other columns."""
    table = pq.read_table(path)
    i = table.column_names.index(name)
    pq.write_table(table.set_column(i, name, pa.array(values, type=table.schema.field(i).type)), path)



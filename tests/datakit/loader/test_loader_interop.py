"""Interop: stock webdataset reads the shards; LeRobot-style items equal stock LeRobotDataset's.

Oracles: the `webdataset` package (its own tar parsing and .npy decoding), the reader, and
lerobot 0.6.1 itself, run in its own venv through tools/lerobot_oracle (skipped when that
venv is absent: it needs Python 3.12 and torch < 2.12, never a dependency of ours).
"""
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from datakit.loader import LeRobotView, lerobot_config, webdataset_urls
from datakit.reader import open_shards
from loader_fixtures import CAMS, shards_rgb  # noqa: F401

LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ORACLE = Path(__file__).resolve().parents[3] / "tools" / "lerobot_oracle" / "lerobot_oracle.py"


def test_webdataset_reads_the_shards(shards_rgb):
    wds = pytest.importorskip("webdataset")
    reader = open_shards(shards_rgb)
    n = 0
    for sample in wds.WebDataset(webdataset_urls(shards_rgb), shardshuffle=False).decode():
        ep, frame = (int(x) for x in sample["__key__"].split("/"))
        row = reader.row(ep, frame)
        for cam in CAMS:
            assert np.array_equal(sample[f"{cam}.npy"], reader.read_raw(row, cam))
        assert np.array_equal(sample["state.npy"], np.asarray(reader.frames.column("state")[row].as_py(), np.float32))
        assert sample["json"]["frame_index"] == frame and sample["json"]["episode_index"] == ep
        n += 1
    assert n == reader.index.num_frames


def test_lerobot_view_items_and_plain_dataloader(shards_rgb):
    view = LeRobotView(shards_rgb, lerobot_config(10.0, {"action": [i / 10 for i in range(5)]}))
    reader = open_shards(shards_rgb)
    item = view[30]  # episode 1, frame 6
    assert {"observation.state", "action", "action_is_pad", "task", "episode_index", "frame_index",
            "timestamp", "index", "task_index", *CAMS} <= set(item)
    assert item["observation.images.top"].shape == (3, 32, 64) and item["action"].shape == (5, 6)
    want = torch.from_numpy(reader.read_frame(1, 6, CAMS[0])).permute(2, 0, 1).float() / 255
    assert torch.equal(item[CAMS[0]], want)
    assert item["task"] == reader.index.tasks[int(item["task_index"])]
    loader = torch.utils.data.DataLoader(view, batch_size=4, num_workers=2, shuffle=False)
    batch = next(iter(loader))  # torch's default collate, as LeRobot training scripts use it
    assert batch["action"].shape == (4, 5, 6) and len(batch["task"]) == 4


@pytest.fixture(scope="module")
def lerobot_v3(tmp_path_factory):
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("lerobot_v3")
    src = make_lerobot_dataset(root / "src", version="v3.0", episode_lengths=(24, 31, 17, 9), height=32,
                               width=64, cameras=CAMS, blank_cameras=(CAMS[2],))
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False))
    return src, out


@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(), reason="no lerobot venv at /tmp/lerobot-venv")
def test_lerobot_view_equals_stock_lerobot_dataset(lerobot_v3, tmp_path):
    src, out = lerobot_v3
    delta = {"action": [i / 10 for i in range(8)], "observation.state": [-0.1, 0.0]}
    indices = [0, 5, 23, 24, 54, 70, 80]
    npz = tmp_path / "items.npz"
    subprocess.run([str(LEROBOT_PY), str(ORACLE), "items", str(src), str(npz), "--indices", *map(str, indices),
                    "--delta", json.dumps(delta)], check=True, capture_output=True)
    want = np.load(npz)
    view = LeRobotView(out, lerobot_config(10.0, delta))
    for i in indices:
        got = view[i]
        for key in ("action", "action_is_pad", "observation.state", "observation.state_is_pad",
                    "episode_index", "frame_index", "index", "task_index"):
            assert np.array_equal(got[key].numpy(), want[f"{i}/{key}"]), (i, key)
        assert np.allclose(got["timestamp"].numpy(), want[f"{i}/timestamp"])
        assert str(want[f"{i}/task"]) == got["task"]
        for cam in CAMS:  # both decode the same AV1 stream; allow decoder rounding only
            diff = np.abs(got[cam].numpy() - want[f"{i}/{cam}"])
            assert diff.mean() < 1.5 / 255 and diff.max() < 16 / 255, (i, cam, diff.mean(), diff.max())

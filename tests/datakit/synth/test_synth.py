"""datakit.synth: barcode round trip through real AV1/H.264, deterministic encoding, generators."""
from __future__ import annotations

import hashlib
import json

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.synth import (encode_video, make_droid_dataset, make_lerobot_dataset, read_frame_number,
                           synth_action, synth_frame, synth_state)


def _decode(path):
    with av.open(str(path)) as c:
        return [(float(f.time), f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]


def test_barcode_raw_roundtrip_and_blank():
    for n in (0, 1, 255, 256, 4095, 65535):
        for h, w in ((64, 96), (96, 128), (224, 224)):
            assert read_frame_number(synth_frame(n, h, w, seed=3)) == n
    assert read_frame_number(np.zeros((96, 128, 3), np.uint8)) == -1
    assert read_frame_number(np.full((96, 128, 3), 255, np.uint8)) == -1
    assert read_frame_number(np.full((96, 128, 3), 128, np.uint8)) == -1
    a, b, c = synth_frame(5, 96, 128, 0), synth_frame(6, 96, 128, 0), synth_frame(5, 96, 128, 1)
    assert a.shape == (96, 128, 3) and a.dtype == np.uint8
    assert not np.array_equal(a[40:], b[40:]) and not np.array_equal(a[40:], c[40:])  # moves, per seed
    assert np.array_equal(a, synth_frame(5, 96, 128, 0))


@pytest.mark.parametrize("codec", ["av1", "h264"])
@pytest.mark.parametrize("hw", [(64, 96), (96, 128)])
def test_barcode_survives_encoding(tmp_path, codec, hw):
    h, w = hw
    numbers = [3 + 7 * i for i in range(24)]
    path = encode_video(tmp_path / "v.mp4", (synth_frame(n, h, w, seed=i) for i, n in enumerate(numbers)),
                        fps=10, codec=codec)
    frames = _decode(path)
    assert [read_frame_number(img) for _, img in frames] == numbers
    assert [round(t, 6) for t, _ in frames] == [round(i / 10, 6) for i in range(24)]
    assert frames[0][1].shape == (h, w, 3)


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_encode_deterministic(tmp_path, codec):
    frames = [synth_frame(i, 64, 96) for i in range(12)]
    a = encode_video(tmp_path / "a.mp4", frames, 15, codec=codec, gop=4)
    b = encode_video(tmp_path / "b.mp4", frames, 15, codec=codec, gop=4)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    assert not list(tmp_path.glob(".*"))  # no temp file left behind


def test_av1_uses_lerobot_settings(tmp_path):
    path = encode_video(tmp_path / "v.mp4", [synth_frame(i, 64, 96) for i in range(6)], 10)
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        assert s.codec_context.name in ("libdav1d", "libaom-av1", "av1")
        assert s.codec_context.pix_fmt == "yuv420p"
        keys = [f.key_frame for f in c.decode(s)]
    assert keys[0] and sum(keys) >= 2  # g=2: more than one key frame in 6 frames


def test_signals_deterministic_and_distinct():
    a = synth_state(0, 20, 6)
    assert a.dtype == np.float32 and a.shape == (20, 6)
    assert np.array_equal(a, synth_state(0, 20, 6))
    assert not np.allclose(a, synth_state(1, 20, 6))
    assert np.all(np.abs(np.diff(a, axis=0)) < 0.5)  # smooth
    assert synth_action(2, 7, 3).shape == (7, 3)


def test_lerobot_v21_files(tmp_path):
    root = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(5, 6), height=64, width=96)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v2.1" and info["total_frames"] == 11 and info["total_episodes"] == 2
    assert info["features"]["observation.images.top"]["shape"] == [3, 64, 96]
    assert info["features"]["observation.images.top"]["info"]["video.codec"] == "av1"
    assert (root / "meta/episodes_stats.jsonl").is_file() and not (root / "meta/stats.json").exists()
    t = pq.read_table(root / "data/chunk-000/episode_000001.parquet")
    assert t.column_names[:2] == ["observation.state", "action"]
    state_type = t.schema.field("observation.state").type
    assert pa.types.is_list(state_type) and state_type.value_type == pa.float32()
    assert t["index"].to_pylist() == list(range(5, 11))
    side = _decode(root / "videos/chunk-000/observation.images.side/episode_000001.mp4")
    assert len(side) == 6 and all(img.max() < 20 for _, img in side)  # blank camera
    top = _decode(root / "videos/chunk-000/observation.images.top/episode_000001.mp4")
    assert [read_frame_number(img) for _, img in top] == list(range(5, 11))  # dataset-wide index


def test_lerobot_v3_files(tmp_path):
    root = make_lerobot_dataset(tmp_path / "ds", version="v3.0", episode_lengths=(4, 5, 3),
                                height=64, width=96, codec="h264", v3_episodes_per_file=2,
                                cameras=("observation.images.top",), blank_cameras=())
    assert sorted(p.name for p in (root / "data/chunk-000").iterdir()) == ["file-000.parquet", "file-001.parquet"]
    frames = _decode(root / "videos/observation.images.top/chunk-000/file-000.mp4")
    assert [read_frame_number(img) for _, img in frames] == list(range(9))
    assert (root / "meta/stats.json").is_file()


def test_droid_files(tmp_path):
    root = make_droid_dataset(tmp_path / "droid", episode_lengths=(4, 5), height=64, width=96, missing_ext2=True)
    metas = sorted(root.rglob("metadata_*.json"))
    assert len(metas) == 2
    m0, m1 = (json.loads(p.read_text()) for p in metas)
    for key in ("uuid", "lab", "current_task", "trajectory_length", "wrist_cam_serial", "ext1_cam_serial",
                "ext2_cam_serial", "hdf5_path", "wrist_mp4_path", "ext1_mp4_path", "ext2_mp4_path"):
        assert key in m0
    assert m1["ext2_cam_serial"] is None and m0["ext2_cam_serial"]
    assert len(list(metas[1].parent.glob("recordings/MP4/*.mp4"))) == 2

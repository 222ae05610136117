"""datakit.sources: scan + load_episode for LeRobot v2.0/v2.1/v3.0 and raw DROID, bad inputs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.errors import SourceError
from datakit.sources import detect_format, load_episode, scan
from datakit.synth import (DROID_TASKS, make_droid_dataset, make_lerobot_dataset, read_frame_number,
                           synth_action, synth_state)

LENGTHS = (5, 7, 4)
TASKS = ("pick up the cube", "open the drawer")
CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
H, W = 64, 96


def _make(tmp_path_factory, version, **kw):
    root = tmp_path_factory.mktemp(version.replace(".", "_")) / "ds"
    args = dict(version=version, episode_lengths=LENGTHS, height=H, width=W, codec="h264", tasks=TASKS)
    args.update(kw)
    return make_lerobot_dataset(root, **args)


@pytest.fixture(scope="module")
def v20(tmp_path_factory):  # channel-last, one camera stored as PNG images in the parquet
    return _make(tmp_path_factory, "v2.0", channel_first=False, image_cameras=("observation.images.wrist",))


@pytest.fixture(scope="module")
def v21(tmp_path_factory):
    return _make(tmp_path_factory, "v2.1", codec="av1")


@pytest.fixture(scope="module")
def v30(tmp_path_factory):  # two data / video / episode-metadata files
    return _make(tmp_path_factory, "v3.0", v3_episodes_per_file=2)


@pytest.fixture(scope="module")
def droid(tmp_path_factory):
    return make_droid_dataset(tmp_path_factory.mktemp("droid") / "raw", episode_lengths=(6, 8), height=H, width=W,
                              missing_ext2=True)


def _copy(root: Path, tmp_path: Path) -> Path:
    dst = tmp_path / root.name
    shutil.copytree(root, dst)
    return dst


def _check_lerobot(spec, version, image_cams=()):
    assert spec.format == "lerobot" and spec.version == version and spec.fps == 10
    assert list(spec.cameras) == list(CAMS)
    for cam in CAMS:
        c = spec.cameras[cam]
        assert (c.name, c.height, c.width) == (cam, H, W)
        assert c.storage == ("image" if cam in image_cams else "video")
    assert spec.tasks == list(TASKS)
    assert spec.state_names == [f"motor_{i}" for i in range(6)] and len(spec.action_names) == 6
    assert [r.episode_index for r in spec.episodes] == [0, 1, 2]
    assert [r.length for r in spec.episodes] == list(LENGTHS)
    for ref in spec.episodes:
        assert set(ref.videos) == {c for c in CAMS if c not in image_cams}
        table = load_episode(spec, ref)
        e, n = ref.episode_index, ref.length
        assert len(table) == n and table.episode_index == e
        assert table.state.dtype == np.float64 and table.action.dtype == np.float64
        np.testing.assert_array_equal(table.state, synth_state(e, n, 6))
        np.testing.assert_array_equal(table.action, synth_action(e, n, 6))
        np.testing.assert_array_equal(table.frame_index, np.arange(n))
        assert table.timestamp.dtype == np.float64
        np.testing.assert_allclose(table.timestamp, np.arange(n) / 10, atol=1e-6)
        assert table.task == TASKS[e % 2] and set(table.task_index.tolist()) == {e % 2}
        assert set(table.images) == set(image_cams)
        for cam in image_cams:
            assert len(table.images[cam]) == n and table.images[cam][0][:8] == b"\x89PNG\r\n\x1a\n"


def test_detect_format(v21, v30, droid, tmp_path):
    assert detect_format(v21) == "lerobot" and detect_format(v30) == "lerobot"
    assert detect_format(droid) == "droid"
    with pytest.raises(SourceError) as err:
        detect_format(tmp_path)
    assert str(err.value) == (f"{tmp_path}: not a LeRobot dataset (no meta/info.json) nor a DROID folder "
                              f"(no metadata_*.json)")


def test_lerobot_v20_channel_last_and_images(v20):
    spec = scan(v20)
    _check_lerobot(spec, "v2.0", image_cams=("observation.images.wrist",))
    # the PNG decodes to the synthetic frame carrying the dataset-wide index
    from PIL import Image
    import io

    table = load_episode(spec, spec.episodes[1])
    img = np.asarray(Image.open(io.BytesIO(table.images["observation.images.wrist"][2])).convert("RGB"))
    assert img.shape == (H, W, 3) and read_frame_number(img) == LENGTHS[0] + 2


def test_lerobot_v21(v21):
    spec = scan(v21, fmt="lerobot")
    _check_lerobot(spec, "v2.1")
    ref = spec.episodes[2]
    vs = ref.videos["observation.images.top"]
    assert vs.path == v21 / "videos/chunk-000/observation.images.top/episode_000002.mp4"
    assert vs.from_timestamp == 0.0 and vs.to_timestamp is None
    assert ref.source == v21 / "data/chunk-000/episode_000002.parquet"


def test_lerobot_v30_multi_file(v30):
    spec = scan(v30)
    _check_lerobot(spec, "v3.0")
    sources = [r.source.name for r in spec.episodes]
    assert sources == ["file-000.parquet", "file-000.parquet", "file-001.parquet"]
    slices = [r.videos["observation.images.top"] for r in spec.episodes]
    assert [s.path.name for s in slices] == ["file-000.mp4", "file-000.mp4", "file-001.mp4"]
    assert [(s.from_timestamp, s.to_timestamp) for s in slices] == [(0.0, 0.5), (0.5, 1.2), (0.0, 0.4)]
    # the slice points at the episode's frames: frame i is at from_timestamp + i / fps
    with av.open(str(slices[1].path)) as c:
        frames = {round(float(f.time), 3): f.to_ndarray(format="rgb24") for f in c.decode(video=0)}
    assert read_frame_number(frames[round(slices[1].from_timestamp + 3 / 10, 3)]) == LENGTHS[0] + 3


def test_lerobot_v30_tasks_column_variants(v30, tmp_path):
    root = _copy(v30, tmp_path)
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert "__index_level_0__" in tasks.column_names  # as pandas writes DataFrame(index=tasks)
    pq.write_table(pa.table({"task_index": [1, 0], "task": [TASKS[1], TASKS[0]]}), root / "meta/tasks.parquet")
    assert scan(root).tasks == list(TASKS)


def test_lerobot_fixed_size_list_state(v21, tmp_path):
    root = _copy(v21, tmp_path)
    path = root / "data/chunk-000/episode_000000.parquet"
    t = pq.read_table(path)
    for key in ("observation.state", "action"):
        col = t[key].combine_chunks()
        fixed = pa.FixedSizeListArray.from_arrays(col.flatten(), 6)
        t = t.set_column(t.column_names.index(key), key, fixed)
    pq.write_table(t, path)
    spec = scan(root)
    np.testing.assert_array_equal(load_episode(spec, spec.episodes[0]).state, synth_state(0, LENGTHS[0], 6))


def test_droid(droid):
    spec = scan(droid)
    assert spec.format == "droid" and spec.version == "droid-raw" and spec.fps == 15
    cams = ["observation.images.wrist_left", "observation.images.exterior_1_left",
            "observation.images.exterior_2_left"]
    assert list(spec.cameras) == cams
    assert all((c.height, c.width, c.storage) == (H, W, "video") for c in spec.cameras.values())
    assert len(spec.state_names) == 8 and len(spec.action_names) == 8
    assert [r.length for r in spec.episodes] == [6, 8]
    assert spec.tasks == list(DROID_TASKS)
    e0, e1 = spec.episodes
    assert all(e0.videos[c] is not None and e0.videos[c].path.is_file() for c in cams)
    assert e1.videos["observation.images.exterior_2_left"] is None  # missing slot
    assert e1.videos["observation.images.wrist_left"].path.parent == e1.source / "recordings/MP4"
    for ref in spec.episodes:
        table = load_episode(spec, ref)
        e, n = ref.episode_index, ref.length
        np.testing.assert_array_equal(table.state, synth_state(e, n, 8))
        np.testing.assert_array_equal(table.action, synth_action(e, n, 8))
        np.testing.assert_allclose(table.timestamp, np.arange(n) / 15)
        assert table.task == DROID_TASKS[e] and table.task_index.tolist() == [e] * n
    with av.open(str(e1.videos["observation.images.wrist_left"].path)) as c:
        first = next(c.decode(video=0)).to_ndarray(format="rgb24")
    assert read_frame_number(first) == 6  # dataset-wide frame index


# ----------------------------------------------------------------------------- bad inputs
def _raises(fn, path_part: str, problem: str) -> SourceError:
    with pytest.raises(SourceError) as err:
        fn()
    msg = str(err.value)
    assert path_part in msg and problem in msg, msg
    return err.value


def test_missing_info_json(v21, tmp_path):
    root = _copy(v21, tmp_path)
    (root / "meta/info.json").unlink()
    _raises(lambda: scan(root, fmt="lerobot"), str(root / "meta/info.json"), "missing meta/info.json")
    _raises(lambda: scan(root), str(root / "meta/info.json"), "missing meta/info.json")


def test_unknown_codebase_version(v21, tmp_path):
    root = _copy(v21, tmp_path)
    info = json.loads((root / "meta/info.json").read_text())
    info["codebase_version"] = "v1.6"
    (root / "meta/info.json").write_text(json.dumps(info))
    _raises(lambda: scan(root), "info.json", "unknown codebase_version 'v1.6' (supported: v2.0, v2.1, v3.0)")


@pytest.mark.parametrize("which", ["v21", "v30"])
def test_garbage_parquet(which, request, tmp_path):
    root = _copy(request.getfixturevalue(which), tmp_path)
    spec = scan(root)
    ref = spec.episodes[0]
    ref.source.write_bytes(b"this is not a parquet file" * 10)
    _raises(lambda: load_episode(spec, ref), ref.source.name, "unreadable parquet")


def test_garbage_v3_episode_metadata(v30, tmp_path):
    root = _copy(v30, tmp_path)
    bad = root / "meta/episodes/chunk-000/file-001.parquet"
    bad.write_bytes(b"PAR1 garbage")
    _raises(lambda: scan(root), "file-001.parquet", "unreadable parquet")


def test_length_mismatch(v21, tmp_path):
    root = _copy(v21, tmp_path)
    path = root / "data/chunk-000/episode_000001.parquet"
    pq.write_table(pq.read_table(path).slice(0, 3), path)
    spec = scan(root)
    _raises(lambda: load_episode(spec, spec.episodes[1]), "episode_000001.parquet", "length 7")


def test_missing_video_is_per_episode(v30, tmp_path):
    root = _copy(v30, tmp_path)
    (root / "videos/observation.images.wrist/chunk-000/file-001.mp4").unlink()
    spec = scan(root)  # scan does not fail
    load_episode(spec, spec.episodes[0])
    _raises(lambda: load_episode(spec, spec.episodes[2]), "file-001.mp4", "missing video file")


def test_droid_missing_video_and_bad_h5(droid, tmp_path):
    root = _copy(droid, tmp_path)
    spec = scan(root)
    e0, e1 = spec.episodes
    e0.videos["observation.images.exterior_1_left"].path.unlink()
    _raises(lambda: load_episode(spec, e0), "22008760.mp4", "missing video file")
    (e1.source / "trajectory.h5").write_bytes(b"not hdf5 at all")
    _raises(lambda: load_episode(spec, e1), "trajectory.h5", "unreadable h5")


def test_droid_is_named_once(droid, tmp_path, capsys):
    """The convert summary said `droid droid-raw (droid)` for a folder named droid; index.json keeps
    "droid-raw" (the resume fingerprint compares it), the terminal says each word once."""
    import io

    from rich.console import Console

    from datakit.commands.doctor.report import print_report
    from datakit.commands.doctor.audit import DoctorReport
    from datakit.commands.summary import index_table, source_label
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig

    src = shutil.copytree(droid, tmp_path / "droid")
    index = convert(src, tmp_path / "out", ConvertConfig(workers=1, progress=False)).index
    assert (index.source["format"], index.source["version"], index.source["name"]) == ("droid", "droid-raw", "droid")
    text = io.StringIO()
    Console(file=text, width=200).print(index_table(index))
    (row,) = [line for line in text.getvalue().splitlines() if " source " in line]
    assert row.split("│")[2].strip() == "droid raw", row
    report = DoctorReport(source=str(src), format="droid", version="droid-raw", episodes=2)
    print_report(report, file=text)
    assert f"{src}: droid raw, 2 episodes" in text.getvalue()
    # other sources keep their version and folder name
    assert source_label("lerobot", "v2.1", "pusht") == "lerobot v2.1 (pusht)"
    assert source_label("droid", "droid-raw", "droid_100") == "droid raw (droid_100)"

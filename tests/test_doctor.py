"""`datakit doctor`: each defect class planted into a tiny generated dataset (LeRobot v2.1 / v3.0,
raw DROID, real H.264 / AV1) must be reported with its file, episode and frame; a clean dataset
exits 0. The expected file/episode/frame come from where the test planted the defect, and frame
counts from a plain PyAV decode."""
from __future__ import annotations

import argparse
import json
import os
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import layout
from datakit.doctor import add_parser, main, run
from datakit.synth import encode_video, make_droid_dataset, make_lerobot_dataset, synth_frame
from datakit.synth.lerobot import camera_seed
from tests.helpers import pyav_decode_all

pytestmark = pytest.mark.timeout(120)

H, W, FPS = 64, 96, 10
LENGTHS = (10, 12, 14)
CAMS = ("observation.images.top", "observation.images.wrist")
TOP = CAMS[0]


@pytest.fixture(scope="module")
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
    return root / layout.LEROBOT_V2_VIDEO_PATH.format(episode_chunk=0, video_key=cam, episode_index=episode)


def v2_table(root: Path, episode: int) -> Path:
    return root / layout.LEROBOT_V2_DATA_PATH.format(episode_chunk=0, episode_index=episode)


def frames_of(episode: int, n: int, cam_index: int = 0) -> list[np.ndarray]:
    start = sum(LENGTHS[:episode])
    return [synth_frame(start + i, H, W, camera_seed(0, cam_index, episode)) for i in range(n)]


def set_column(path: Path, name: str, values) -> None:
    """Replace one column of a parquet file, keeping its type and the other columns."""
    table = pq.read_table(path)
    i = table.column_names.index(name)
    pq.write_table(table.set_column(i, name, pa.array(values, type=table.schema.field(i).type)), path)


# --- clean datasets and unusable input -----------------------------------------------------------

@pytest.mark.parametrize("name", ["v2.1", "v3.0", "droid"])
def test_clean_dataset_exits_0_and_decodes_every_frame(dataset, name):
    src = dataset(name)
    rc, rep = doctor(src, "--workers", "2")
    assert rc == 0 and rep["clean"] and rep["findings"] == [], rep["findings"]
    oracle = sum(len(pyav_decode_all(p)) for p in src.rglob("*.mp4"))  # every frame of every file
    assert rep["frames_decoded"] == oracle
    assert rep["episodes"] == (2 if name == "droid" else 3)


def test_missing_folder_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--no-progress"]) == 2
    assert "nope" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()  # a folder of neither format: unusable too, not a finding
    assert main([str(tmp_path / "empty"), "--no-progress"]) == 2
    assert "empty" in capsys.readouterr().err


def test_unscannable_metadata_is_one_finding(dataset):
    src = dataset("v2.1")
    (src / layout.LEROBOT_INFO).write_text("[1, 2")
    rc, rep = doctor(src)
    assert rc == 1
    [f] = rep["findings"]
    assert f["kind"] == "metadata" and f["path"] == str(src / layout.LEROBOT_INFO)


# --- videos ---------------------------------------------------------------------------------------

def test_video_that_does_not_open(dataset):
    src = dataset("v2.1")
    bad = v2_video(src, 1)
    bad.write_bytes(b"\x00not an mp4" * 100)
    rc, rep = doctor(src)
    assert rc == 1
    [f] = of_kind(rep, "video_unreadable")
    assert (f["path"], f["episode"], f["severity"]) == (str(bad), 1, "error")
    assert all(g["episode"] == 1 for g in rep["findings"])  # nothing else is wrong


def _damage_packet(path: Path, frame: int) -> None:
    """Zero the second half of the packet that carries `frame` (found by its pts)."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        [(pos, size)] = [(p.pos, p.size) for p in c.demux(s)
                         if p.size and int(round(float(p.pts * s.time_base) * FPS)) == frame]
    data = bytearray(path.read_bytes())
    data[pos + size // 2:pos + size] = bytes(size - size // 2)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("codec,frame,kind", [("av1", 3, "video_decode_error"), ("h264", 9, "video_corrupt_frame")])
def test_damaged_frame_data_is_pinned_to_its_frame(dataset, codec, frame, kind):
    # AV1 (dav1d) refuses the damaged packet; H.264 conceals the damage and decodes a picture
    # anyway, which exits 0 in convert today (issue 7, "damaged video data")
    src = dataset("v2.1")
    path = v2_video(src, 2)
    encode_video(path, frames_of(2, LENGTHS[2]), FPS, codec)
    clean_rc, _ = doctor(src)
    _damage_packet(path, frame)
    rc, rep = doctor(src)
    assert clean_rc == 0 and rc == 1
    hits = of_kind(rep, kind)
    assert hits and all((f["path"], f["episode"]) == (str(path), 2) for f in hits)
    assert min(f["frame"] for f in hits) == frame


def test_frame_count_disagrees_with_table(dataset):
    src = dataset("v2.1")
    path = v2_video(src, 1)
    encode_video(path, frames_of(1, LENGTHS[1] - 3), FPS, "h264")
    rc, rep = doctor(src)
    [f] = of_kind(rep, "video_frame_count")
    assert rc == 1 and (f["path"], f["episode"], f["frame"]) == (str(path), 1, LENGTHS[1] - 3)
    assert f["severity"] == "error" and f"{LENGTHS[1] - 3} frames decoded" in f["message"]


def test_fps_disagrees_with_table(dataset):
    src = dataset("v2.1")
    path = v2_video(src, 0, CAMS[1])
    encode_video(path, frames_of(0, LENGTHS[0], 1), 2 * FPS, "h264")
    rc, rep = doctor(src)
    [f] = of_kind(rep, "video_fps")
    assert rc == 1 and (f["path"], f["episode"]) == (str(path), 0) and "20" in f["message"]


def _encode_with_pts(path: Path, frames: list[np.ndarray], pts: list[int]) -> None:
    """H.264 mp4 whose frame i is presented at pts[i] / FPS (to plant timestamp gaps)."""
    rate = Fraction(FPS)
    with av.open(str(path), "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=rate, options={"threads": "1", "bf": "0"})
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.codec_context.time_base = 1 / rate
        for img, t in zip(frames, pts):
            fr = av.VideoFrame.from_ndarray(img, format="rgb24")
            fr.pts, fr.time_base = t, 1 / rate
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def test_video_timestamp_gap(dataset):
    src = dataset("v2.1")
    path, n, k = v2_video(src, 1), LENGTHS[1], 5
    _encode_with_pts(path, frames_of(1, n), [i if i < k else i + 3 for i in range(n)])
    assert len(pyav_decode_all(path)) == n  # the count agrees; only the timing is wrong
    rc, rep = doctor(src)
    [f] = of_kind(rep, "video_timestamps")
    assert rc == 1 and (f["path"], f["episode"], f["frame"]) == (str(path), 1, k)
    assert "3 frame(s) missing" in f["message"]


def test_table_timestamps_backwards_and_with_gaps(dataset):
    src = dataset("v2.1")
    back = np.arange(LENGTHS[0]) / FPS
    back[6] = back[5] - 0.05  # goes backwards at frame 6
    gap = np.arange(LENGTHS[2]) / FPS
    gap[8:] += 0.5  # five frames dropped before frame 8
    set_column(v2_table(src, 0), "timestamp", back)
    set_column(v2_table(src, 2), "timestamp", gap)
    rc, rep = doctor(src)
    assert rc == 1
    [b] = of_kind(rep, "timestamp")
    [g] = of_kind(rep, "timestamp_gap")
    assert (b["path"], b["episode"], b["frame"]) == (str(v2_table(src, 0)), 0, 6)
    assert (g["path"], g["episode"], g["frame"]) == (str(v2_table(src, 2)), 2, 8)


# --- episodes and tables --------------------------------------------------------------------------

def test_duplicated_episode(dataset):
    src = dataset("v2.1")
    ep = src / layout.LEROBOT_V2_EPISODES
    lines = ep.read_text().splitlines()
    ep.write_text("\n".join(lines + [lines[1]]) + "\n")
    rc, rep = doctor(src)
    [f] = of_kind(rep, "duplicate_episode")
    assert rc == 1 and (f["episode"], f["path"]) == (1, str(v2_table(src, 1)))


def test_overlapping_episodes_in_one_video_file(dataset):
    src = dataset("v3.0")
    [meta] = sorted((src / layout.LEROBOT_V3_EPISODES_DIR).glob(layout.LEROBOT_V3_EPISODES_GLOB))
    col = f"videos/{TOP}/from_timestamp"
    starts = pq.read_table(meta)[col].to_pylist()
    starts[1] -= 0.5  # episode 1 now starts 5 frames inside episode 0
    set_column(meta, col, starts)
    rc, rep = doctor(src)
    [f] = of_kind(rep, "overlapping_video_range")
    video = src / layout.LEROBOT_V3_VIDEO_PATH.format(video_key=TOP, chunk_index=0, file_index=0)
    assert rc == 1 and (f["episode"], f["path"]) == (1, str(video))


def test_nonfinite_state_and_action(dataset):
    src = dataset("v2.1")
    table = pq.read_table(v2_table(src, 2))
    state = np.stack(table[layout.LEROBOT_STATE_KEY].to_numpy(zero_copy_only=False))
    state[4, 1] = np.nan
    action = np.stack(table[layout.LEROBOT_ACTION_KEY].to_numpy(zero_copy_only=False))
    action[7, 0] = np.inf
    set_column(v2_table(src, 2), layout.LEROBOT_STATE_KEY, list(state))
    set_column(v2_table(src, 2), layout.LEROBOT_ACTION_KEY, list(action))
    rc, rep = doctor(src)
    found = sorted((f["frame"], f["episode"], f["path"]) for f in of_kind(rep, "nonfinite"))
    assert rc == 1 and found == [(4, 2, str(v2_table(src, 2))), (7, 2, str(v2_table(src, 2)))]


def test_constant_column(dataset):
    src = dataset("v2.1")
    all_actions = []
    for e, n in enumerate(LENGTHS):
        action = np.stack(pq.read_table(v2_table(src, e))[layout.LEROBOT_ACTION_KEY].to_numpy(zero_copy_only=False))
        action[:, 2] = 0.25
        set_column(v2_table(src, e), layout.LEROBOT_ACTION_KEY, list(action))
        all_actions.append(action)
    oracle = np.flatnonzero(np.ptp(np.concatenate(all_actions), axis=0) == 0)  # numpy: which are constant
    rc, rep = doctor(src)
    found = of_kind(rep, "constant_column")
    assert rc == 1 and list(oracle) == [2] and len(found) == 1
    assert "'motor_2'" in found[0]["message"] and found[0]["message"].startswith("action")
    assert found[0]["path"] == str(src / layout.LEROBOT_INFO)


def test_unused_task(tmp_path):
    src = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(8, 9), cameras=(TOP,),
                               blank_cameras=(), height=H, width=W, fps=FPS, codec="h264",
                               tasks=("pick", "place", "never done"))
    rc, rep = doctor(src)
    [f] = rep["findings"]
    assert rc == 1 and f["kind"] == "unused_task" and "'never done'" in f["message"]
    assert f["path"] == str(src / layout.LEROBOT_V2_TASKS)


# --- cameras and files ----------------------------------------------------------------------------

def test_blank_camera(tmp_path):
    side = "observation.images.side"
    src = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(8, 9), cameras=(TOP, side),
                               blank_cameras=(side,), height=H, width=W, fps=FPS, codec="h264")
    rc, rep = doctor(src)
    found = sorted((f["episode"], f["frame"], f["path"]) for f in of_kind(rep, "blank_camera"))
    assert rc == 1 and found == [(e, 0, str(v2_video(src, e, side))) for e in (0, 1)]
    assert doctor(src, "--ignore", "blank_camera")[0] == 0


def test_frozen_camera(dataset):
    src = dataset("v2.1")
    path, k = v2_video(src, 2), 6
    frames = frames_of(2, LENGTHS[2])
    encode_video(path, frames[:k] + [frames[k]] * (LENGTHS[2] - k), FPS, "h264")  # stuck from frame k
    rc, rep = doctor(src, "--frozen-seconds", "0.5")
    [f] = of_kind(rep, "frozen_camera")
    assert rc == 1 and (f["path"], f["episode"], f["frame"]) == (str(path), 2, k)
    assert f"{LENGTHS[2] - k} identical frames" in f["message"]
    assert doctor(src, "--frozen-seconds", "1.0")[1]["findings"] == []  # 8 frames < 10


def test_missing_files_and_the_rest_still_audited(dataset):
    src = dataset("v2.1")
    gone_video, gone_table = v2_video(src, 1), v2_table(src, 2)
    gone_video.unlink()
    gone_table.unlink()
    action = np.stack(pq.read_table(v2_table(src, 1))[layout.LEROBOT_ACTION_KEY].to_numpy(zero_copy_only=False))
    action[3, 0] = np.nan  # episode 1's table must still be read despite its missing video
    set_column(v2_table(src, 1), layout.LEROBOT_ACTION_KEY, list(action))
    rc, rep = doctor(src)
    missing = sorted((f["episode"], f["path"]) for f in of_kind(rep, "missing_file"))
    assert rc == 1 and missing == [(1, str(gone_video)), (2, str(gone_table))]
    [nan] = of_kind(rep, "nonfinite")
    assert (nan["episode"], nan["frame"]) == (1, 3)
    # the videos of episode 2 are still decoded: every frame of every remaining file
    assert rep["frames_decoded"] == sum(len(pyav_decode_all(p)) for p in src.rglob("*.mp4"))


def test_droid_missing_camera_and_trajectory_files(dataset):
    src = dataset("droid")
    [mp4] = [p for p in src.rglob("*.mp4") if "10:01:46" in str(p) and p.stem == "22008760"]
    [h5] = [p for p in src.rglob(layout.DROID_TRAJECTORY) if "10:00:46" in str(p)]
    mp4.unlink()
    h5.unlink()
    rc, rep = doctor(src)
    found = sorted((f["kind"], f["episode"], f["path"]) for f in rep["findings"])
    assert rc == 1 and found == [("missing_file", 0, str(h5)), ("missing_file", 1, str(mp4))]


# --- runner, report and CLI -----------------------------------------------------------------------

def test_workers_give_the_same_report_as_one_process(dataset):
    src = dataset("v2.1")
    v2_video(src, 0).write_bytes(b"garbage")
    encode_video(v2_video(src, 2), frames_of(2, 5), FPS, "h264")
    _, one = doctor(src, "--workers", "1")
    _, two = doctor(src, "--workers", "3")
    assert one["findings"] and one["findings"] == two["findings"]


def test_json_on_stdout_and_cli_wiring(dataset, capsys):
    src = dataset("v2.1")
    v2_video(src, 1).unlink()
    parser = argparse.ArgumentParser(prog="datakit")  # the shape datakit.cli uses
    add_parser(parser.add_subparsers(dest="command", required=True))
    rc = run(parser.parse_args(["doctor", str(src), "--no-progress", "--workers", "1", "--json", "-"]))
    out, err = capsys.readouterr()
    rep = json.loads(out)  # stdout holds only the JSON; the table went to stderr
    assert rc == 1 and rep["schema"] == "datakit.doctor/1" and rep["counts"] == {"missing_file": 1}
    assert "missing_file" in err


def test_image_camera_damaged_and_frozen(tmp_path):
    """Cameras stored as PNGs inside the table: a broken image is pinned to its frame, and the
    frozen check runs on them as on video."""
    wrist = "observation.images.wrist"
    src = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(8, 9), cameras=(TOP,),
                               image_cameras=(wrist,), blank_cameras=(), height=H, width=W, fps=FPS,
                               codec="h264")
    path = v2_table(src, 1)
    table = pq.read_table(path)
    cells = table[wrist].to_pylist()
    cells[5]["bytes"] = cells[5]["bytes"][:40]  # a truncated PNG
    for i in range(1, len(cells)):
        if i != 5:
            cells[i]["bytes"] = cells[0]["bytes"]  # otherwise stuck on the first image
    i = table.column_names.index(wrist)
    pq.write_table(table.set_column(i, wrist, pa.array(cells, type=table.schema.field(i).type)), path)
    rc, rep = doctor(src, "--frozen-seconds", "0.3")
    [bad] = of_kind(rep, "image_unreadable")
    assert rc == 1 and (bad["path"], bad["episode"], bad["frame"]) == (str(path), 1, 5)
    frozen = sorted((f["episode"], f["frame"]) for f in of_kind(rep, "frozen_camera"))
    assert frozen == [(1, 0), (1, 6)]  # frames 0-4 and 6-8 (3 frames = 0.3 s) are one image
    assert rep["frames_decoded"] == (8 + 9) * 2 - 1


def _die_on_episode_1(position: int):
    """A pool task that is killed like the OOM killer does, for episode position 1."""
    import os
    import signal

    from datakit.doctor import audit

    if position == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return audit.audit_episode(audit._WORKER["spec"], audit._WORKER["spec"].episodes[position],
                               audit._WORKER["opts"])


@pytest.mark.timeout(60)
def test_killed_worker_is_a_finding_not_a_hang(dataset, monkeypatch):
    if os.environ.get("DATAKIT_MP_START", "fork") != "fork":
        pytest.skip("the planted task reaches workers only through fork")
    from datakit.doctor import audit

    src = dataset("v2.1")
    monkeypatch.setattr(audit, "_audit_at", _die_on_episode_1)
    rc, rep = doctor(src, "--workers", "2")
    failed = of_kind(rep, "audit_failed")
    assert rc == 1 and 1 in {f["episode"] for f in failed}
    assert all("BrokenProcessPool" in f["message"] for f in failed)


def test_truncated_video_with_index_first(dataset):
    """An mp4 whose index (moov) comes first and whose frame data is cut: it opens, the index
    lists every frame, and decoding stops early (a copy interrupted mid-way)."""
    src = dataset("v2.1")
    path, n = v2_video(src, 0), LENGTHS[0]
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as c:
        s = c.add_stream("libx264", rate=FPS, options={"threads": "1"})
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        for i, img in enumerate(frames_of(0, n)):
            fr = av.VideoFrame.from_ndarray(img, format="rgb24")
            fr.pts = i
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    with av.open(str(path)) as c:  # cut inside the packet of frame 6
        st = c.streams.video[0]
        packets = [(p.pos, p.size, p.pts * st.time_base * FPS) for p in c.demux(st) if p.size]
    [cut] = [pos + size // 2 for pos, size, t in packets if t == 6]
    whole = sum(pos + size <= cut for pos, size, _ in packets)  # packets left entire: the most that can decode
    path.write_bytes(path.read_bytes()[:cut])
    first_run = 0  # frames a plain PyAV loop gets before it gives up: the least
    try:
        with av.open(str(path)) as c:
            for _ in c.decode(video=0):
                first_run += 1
    except av.FFmpegError:
        pass
    rc, rep = doctor(src)
    [f] = of_kind(rep, "video_frame_count")
    assert rc == 1 and (f["path"], f["episode"], f["severity"]) == (str(path), 0, "error")
    assert 0 < first_run <= f["frame"] <= whole < n
    assert f"{f['frame']} frames decoded" in f["message"]
    assert f"of the {n} frames its index lists (truncated?)" in f["message"]


def test_duplicated_episode_content(dataset):
    """Episode 1 replaced by a copy of episode 0's recording (table, videos), under its own index."""
    src = dataset("v2.1")
    table = pq.read_table(v2_table(src, 0))
    i = table.column_names.index("episode_index")
    table = table.set_column(i, "episode_index", pa.array(np.ones(len(table), np.int64)))
    i = table.column_names.index("task_index")  # keep episode 1's task, so that no task goes unused
    table = table.set_column(i, "task_index", pa.array(np.ones(len(table), np.int64)))
    pq.write_table(table, v2_table(src, 1))
    for cam in CAMS:
        shutil.copy(v2_video(src, 0, cam), v2_video(src, 1, cam))
    ep = src / layout.LEROBOT_V2_EPISODES
    rows = [json.loads(line) for line in ep.read_text().splitlines()]
    rows[1]["length"] = LENGTHS[0]
    ep.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, rep = doctor(src)
    [f] = rep["findings"]
    assert rc == 1 and (f["kind"], f["episode"], f["path"]) == ("duplicate_episode_content", 1, str(v2_table(src, 1)))
    assert "episode 0" in f["message"]


def test_v3_damage_is_named_by_episode_and_episode_frame(dataset):
    """In v3.0 one mp4 holds every episode: damage at file frame 10 + 3 is episode 1's frame 3."""
    src = dataset("v3.0")
    path = src / layout.LEROBOT_V3_VIDEO_PATH.format(video_key=TOP, chunk_index=0, file_index=0)
    _damage_packet(path, LENGTHS[0] + 3)
    rc, rep = doctor(src)
    hits = of_kind(rep, "video_decode_error")
    assert rc == 1 and hits and {(f["path"], f["episode"]) for f in hits} == {(str(path), 1)}
    assert min(f["frame"] for f in hits) == 3


@pytest.mark.timeout(60)
def test_module_entry_point(dataset):
    """`python -m datakit.doctor`, progress bar on: JSON alone on stdout, exit code from the findings."""
    import subprocess
    import sys

    src = dataset("v2.1")
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "datakit.doctor", str(src), "--workers", "2", "--json", "-"]
    clean = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=50)
    v2_video(src, 2).unlink()
    broken = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=50)
    assert clean.returncode == 0 and json.loads(clean.stdout)["clean"]
    assert broken.returncode == 1 and json.loads(broken.stdout)["counts"] == {"missing_file": 1}


def _plant_short_video(src: Path) -> None:
    encode_video(v2_video(src, 1), frames_of(1, LENGTHS[1] - 3), FPS, "h264")


def _plant_nan(src: Path) -> None:
    table = pq.read_table(v2_table(src, 2))
    state = np.stack(table[layout.LEROBOT_STATE_KEY].to_numpy(zero_copy_only=False))
    state[4, 1] = np.nan
    set_column(v2_table(src, 2), layout.LEROBOT_STATE_KEY, list(state))


def _plant_duplicate(src: Path) -> None:
    ep = src / layout.LEROBOT_V2_EPISODES
    lines = ep.read_text().splitlines()
    ep.write_text("\n".join(lines + [lines[0]]) + "\n")


@pytest.mark.parametrize("plant", [
    lambda src: v2_video(src, 0).write_bytes(b"garbage"),
    lambda src: v2_video(src, 2).unlink(),
    _plant_short_video, _plant_nan, _plant_duplicate, None,
], ids=["unreadable", "missing", "short", "nan", "duplicate", "clean"])
def test_errors_are_what_convert_rejects(dataset, tmp_path, plant):
    """The cross-check with convert itself: a dataset doctor finds an error in is one convert
    refuses, and one it finds clean converts."""
    from datakit.config import ConvertConfig
    from datakit.convert import convert
    from datakit.errors import DatakitError

    src = dataset("v2.1")
    if plant is not None:
        plant(src)
    _, rep = doctor(src)
    cfg = ConvertConfig(workers=1, progress=False, decoder="pyav")
    if plant is None:
        assert rep["clean"]
        convert(src, tmp_path / "out", cfg)
    else:
        assert rep["errors"] >= 1
        with pytest.raises(DatakitError):
            convert(src, tmp_path / "out", cfg)

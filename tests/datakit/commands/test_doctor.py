"""`datakit doctor`: each defect class planted into a tiny generated dataset (LeRobot v2.1 / v3.0,
raw DROID, real H.264 / AV1) must be reported with its file, episode and frame; a clean dataset
exits 0. The expected file/episode/frame come from where the test planted the defect, and frame
counts from a plain PyAV decode."""
from __future__ import annotations


import numpy as np
import pyarrow.parquet as pq
import pytest

from datakit import source_paths
from datakit.commands.doctor import main
from datakit.synth import encode_video, make_lerobot_dataset
from helpers import pyav_decode_all
from doctor_fixtures import FPS, H, LENGTHS, TOP, W, doctor, frames_of, of_kind, set_column, v2_table, v2_video

pytestmark = pytest.mark.timeout(120)

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
    (src / source_paths.LEROBOT_INFO).write_text("[1, 2")
    rc, rep = doctor(src)
    assert rc == 1
    [f] = rep["findings"]
    assert f["kind"] == "metadata" and f["path"] == str(src / source_paths.LEROBOT_INFO)


# --- episodes and tables --------------------------------------------------------------------------

def test_duplicated_episode(dataset):
    src = dataset("v2.1")
    ep = src / source_paths.LEROBOT_V2_EPISODES
    lines = ep.read_text().splitlines()
    ep.write_text("\n".join(lines + [lines[1]]) + "\n")
    rc, rep = doctor(src)
    [f] = of_kind(rep, "duplicate_episode")
    assert rc == 1 and (f["episode"], f["path"]) == (1, str(v2_table(src, 1)))


def test_overlapping_episodes_in_one_video_file(dataset):
    src = dataset("v3.0")
    [meta] = sorted((src / source_paths.LEROBOT_V3_EPISODES_DIR).glob(source_paths.LEROBOT_V3_EPISODES_GLOB))
    col = f"videos/{TOP}/from_timestamp"
    starts = pq.read_table(meta)[col].to_pylist()
    starts[1] -= 0.5  # episode 1 now starts 5 frames inside episode 0
    set_column(meta, col, starts)
    rc, rep = doctor(src)
    [f] = of_kind(rep, "overlapping_video_range")
    video = src / source_paths.LEROBOT_V3_VIDEO_PATH.format(video_key=TOP, chunk_index=0, file_index=0)
    assert rc == 1 and (f["episode"], f["path"]) == (1, str(video))


def test_nonfinite_state_and_action(dataset):
    src = dataset("v2.1")
    table = pq.read_table(v2_table(src, 2))
    state = np.stack(table[source_paths.LEROBOT_STATE_KEY].to_numpy(zero_copy_only=False))
    state[4, 1] = np.nan
    action = np.stack(table[source_paths.LEROBOT_ACTION_KEY].to_numpy(zero_copy_only=False))
    action[7, 0] = np.inf
    set_column(v2_table(src, 2), source_paths.LEROBOT_STATE_KEY, list(state))
    set_column(v2_table(src, 2), source_paths.LEROBOT_ACTION_KEY, list(action))
    rc, rep = doctor(src)
    found = sorted((f["frame"], f["episode"], f["path"]) for f in of_kind(rep, "nonfinite"))
    assert rc == 1 and found == [(4, 2, str(v2_table(src, 2))), (7, 2, str(v2_table(src, 2)))]


def test_constant_column(dataset):
    src = dataset("v2.1")
    all_actions = []
    for e, n in enumerate(LENGTHS):
        action = np.stack(pq.read_table(v2_table(src, e))[source_paths.LEROBOT_ACTION_KEY].to_numpy(zero_copy_only=False))
        action[:, 2] = 0.25
        set_column(v2_table(src, e), source_paths.LEROBOT_ACTION_KEY, list(action))
        all_actions.append(action)
    oracle = np.flatnonzero(np.ptp(np.concatenate(all_actions), axis=0) == 0)  # numpy: which are constant
    rc, rep = doctor(src, "--strict")  # warnings: exit 1 with --strict only
    found = of_kind(rep, "constant_column")
    assert rc == 1 and list(oracle) == [2] and len(found) == 1
    assert "'motor_2'" in found[0]["message"] and found[0]["message"].startswith("action")
    assert found[0]["path"] == str(src / source_paths.LEROBOT_INFO)


def test_unused_task(tmp_path):
    src = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(8, 9), cameras=(TOP,),
                               blank_cameras=(), height=H, width=W, fps=FPS, codec="h264",
                               tasks=("pick", "place", "never done"))
    rc, rep = doctor(src, "--strict")
    [f] = rep["findings"]
    assert rc == 1 and f["kind"] == "unused_task" and "'never done'" in f["message"]
    assert f["path"] == str(src / source_paths.LEROBOT_V2_TASKS)


# --- cameras and files ----------------------------------------------------------------------------

def test_blank_camera(tmp_path):
    side = "observation.images.side"
    src = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(8, 9), cameras=(TOP, side),
                               blank_cameras=(side,), height=H, width=W, fps=FPS, codec="h264")
    rc, rep = doctor(src, "--strict")
    found = sorted((f["episode"], f["frame"], f["path"]) for f in of_kind(rep, "blank_camera"))
    assert rc == 1 and found == [(e, 0, str(v2_video(src, e, side))) for e in (0, 1)]
    assert doctor(src, "--ignore", "blank_camera")[0] == 0


def test_frozen_camera(dataset):
    src = dataset("v2.1")
    path, k = v2_video(src, 2), 6
    frames = frames_of(2, LENGTHS[2])
    encode_video(path, frames[:k] + [frames[k]] * (LENGTHS[2] - k), FPS, "h264")  # stuck from frame k
    rc, rep = doctor(src, "--frozen-seconds", "0.5", "--strict")
    [f] = of_kind(rep, "frozen_camera")
    assert rc == 1 and (f["path"], f["episode"], f["frame"]) == (str(path), 2, k)
    assert f"{LENGTHS[2] - k} identical frames" in f["message"]
    assert doctor(src, "--frozen-seconds", "1.0")[1]["findings"] == []  # 8 frames < 10


def test_missing_files_and_the_rest_still_audited(dataset):
    src = dataset("v2.1")
    gone_video, gone_table = v2_video(src, 1), v2_table(src, 2)
    gone_video.unlink()
    gone_table.unlink()
    action = np.stack(pq.read_table(v2_table(src, 1))[source_paths.LEROBOT_ACTION_KEY].to_numpy(zero_copy_only=False))
    action[3, 0] = np.nan  # episode 1's table must still be read despite its missing video
    set_column(v2_table(src, 1), source_paths.LEROBOT_ACTION_KEY, list(action))
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
    [h5] = [p for p in src.rglob(source_paths.DROID_TRAJECTORY) if "10:00:46" in str(p)]
    mp4.unlink()
    h5.unlink()
    rc, rep = doctor(src)
    found = sorted((f["kind"], f["episode"], f["path"]) for f in rep["findings"])
    assert rc == 1 and found == [("missing_file", 0, str(h5)), ("missing_file", 1, str(mp4))]


# --- the list of checks (issue 26, item 8) -----------------------------------------------------------

def _kinds_in_the_source() -> set[str]:
    """Every finding kind the code can emit, read from the source text (the oracle): the literal
    first argument of Finding(...), a camera tracker's add(...), the packet report(...), and the
    (frame, kind, message) tuples of the image checks."""
    import re
    from pathlib import Path

    pattern = re.compile(r'(?:\bFinding\(\s*|\.add\(\s*|\breport\(\s*|\(i, )"([a-z_]+)"')
    root = Path(__file__).resolve().parents[3] / "datakit"
    return {k for p in root.rglob("*.py") for k in pattern.findall(p.read_text())}


def test_list_checks_prints_every_kind_the_audit_can_report(capsys):
    from datakit.cli import main as datakit_main

    assert datakit_main(["doctor", "--list-checks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [x.split()[0] for x in lines]
    assert len(listed) == len(set(listed)) and set(listed) == _kinds_in_the_source()
    by_kind = {x.split()[0]: x.split()[1] for x in lines}
    assert {by_kind[k] for k in ("blank_camera", "frozen_camera", "constant_column", "unused_task")} == {"warning"}
    assert {by_kind[k] for k in ("missing_file", "nonfinite", "video_decode_error")} == {"error"}
    assert all(len(x.split(None, 2)) == 3 for x in lines)  # kind, severity, what it means


def test_doctor_without_a_folder_or_list_checks_is_one_line(capsys):
    assert main(["--no-progress"]) == 2
    assert capsys.readouterr().err == "datakit doctor: error: the source dataset folder is required (or --list-checks)\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--list-checks" in capsys.readouterr().out

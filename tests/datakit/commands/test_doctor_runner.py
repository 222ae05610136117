"""`datakit doctor`: the runner (workers, a killed worker), the report and CLI wiring, image
cameras, duplicated episode content, and agreement with what `convert` rejects."""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import source_paths
from datakit.commands.doctor import add_parser, run
from datakit.synth import encode_video, make_lerobot_dataset
from doctor_fixtures import CAMS, FPS, H, LENGTHS, TOP, W, doctor, frames_of, of_kind, set_column, v2_table, v2_video

pytestmark = pytest.mark.timeout(120)

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

    from datakit.commands.doctor import audit

    if position == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return audit.audit_episode(audit._WORKER["spec"], audit._WORKER["spec"].episodes[position],
                               audit._WORKER["opts"])


@pytest.mark.timeout(60)
def test_killed_worker_is_a_finding_not_a_hang(dataset, monkeypatch):
    if os.environ.get("DATAKIT_MP_START", "fork") != "fork":
        pytest.skip("the planted task reaches workers only through fork")
    from datakit.commands.doctor import audit

    src = dataset("v2.1")
    monkeypatch.setattr(audit, "_audit_at", _die_on_episode_1)
    rc, rep = doctor(src, "--workers", "2")
    failed = of_kind(rep, "audit_failed")
    assert rc == 1 and 1 in {f["episode"] for f in failed}
    assert all("BrokenProcessPool" in f["message"] for f in failed)


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
    ep = src / source_paths.LEROBOT_V2_EPISODES
    rows = [json.loads(line) for line in ep.read_text().splitlines()]
    rows[1]["length"] = LENGTHS[0]
    ep.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, rep = doctor(src, "--strict")  # a warning
    [f] = rep["findings"]
    assert rc == 1 and (f["kind"], f["episode"], f["path"]) == ("duplicate_episode_content", 1, str(v2_table(src, 1)))
    assert "episode 0" in f["message"]


@pytest.mark.timeout(60)
def test_module_entry_point(dataset):
    """`python -m datakit.commands.doctor`, progress bar on: JSON alone on stdout, exit code from the findings."""
    import subprocess
    import sys

    src = dataset("v2.1")
    repo = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "datakit.commands.doctor", str(src), "--workers", "2", "--json", "-"]
    clean = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=50)
    v2_video(src, 2).unlink()
    broken = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=50)
    assert clean.returncode == 0 and json.loads(clean.stdout)["clean"]
    assert broken.returncode == 1 and json.loads(broken.stdout)["counts"] == {"missing_file": 1}


def _plant_short_video(src: Path) -> None:
    encode_video(v2_video(src, 1), frames_of(1, LENGTHS[1] - 3), FPS, "h264")


def _plant_nan(src: Path) -> None:
    table = pq.read_table(v2_table(src, 2))
    state = np.stack(table[source_paths.LEROBOT_STATE_KEY].to_numpy(zero_copy_only=False))
    state[4, 1] = np.nan
    set_column(v2_table(src, 2), source_paths.LEROBOT_STATE_KEY, list(state))


def _plant_duplicate(src: Path) -> None:
    ep = src / source_paths.LEROBOT_V2_EPISODES
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
    from datakit.convert.config import ConvertConfig
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

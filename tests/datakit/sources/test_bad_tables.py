"""Contradictory source tables and empty datasets are refused with one line naming the file,
at planning time (scan) where the metadata shows it, else for the episode whose table shows it."""
from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.cli import main
from datakit.errors import SourceError
from datakit.sources import load_episode, scan
from datakit.sources.checks import check_dataset, check_episode_table
from datakit.synth import make_lerobot_dataset
from datakit.synth.damage import set_table_values

LENGTHS = (5, 4, 6)
CAM = "observation.images.top"


def _make(root, version):
    return make_lerobot_dataset(root, version=version, episode_lengths=LENGTHS, cameras=(CAM,), blank_cameras=(),
                                height=64, width=96, codec="h264", fps=10)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("t")
    return {v: _make(root / v, v) for v in ("v2.1", "v3.0")}


@pytest.fixture
def v21(bases, tmp_path):
    return shutil.copytree(bases["v2.1"], tmp_path / "v21")


@pytest.fixture
def v30(bases, tmp_path):
    return shutil.copytree(bases["v3.0"], tmp_path / "v30")


def _episodes_jsonl(ds, edit):
    path = ds / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in edit(rows)))


def _v3_rows(ds, edit):
    path = ds / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(pa.Table.from_pylist(edit(table.to_pylist()), schema=table.schema), path)


def _one_line_refusal(capsys, ds, tmp_path, *words):
    rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "out" / "index.json").exists()


def _set(rows, i, **kw):
    rows[i] = {**rows[i], **kw}
    return rows


def _kinds(spec):
    return [(f.kind, f.severity) for f in check_dataset(spec)]


# planning time -------------------------------------------------------------------------------
def test_duplicated_episode_row_v21(v21, tmp_path, capsys):
    _episodes_jsonl(v21, lambda rows: rows + [rows[1]])
    assert ("duplicate_episode", "error") in _kinds(scan(v21, check=False))
    _one_line_refusal(capsys, v21, tmp_path, "episode 1 is listed more than once")


def test_duplicated_episode_row_v30(v30, tmp_path, capsys):
    _v3_rows(v30, lambda rows: rows + [rows[2]])
    _one_line_refusal(capsys, v30, tmp_path, "episode 2 is listed more than once")


def test_negative_from_timestamp_v30(v30, tmp_path, capsys):
    _v3_rows(v30, lambda rows: _set(rows, 0, **{f"videos/{CAM}/from_timestamp": -0.2}))
    _one_line_refusal(capsys, v30, tmp_path, "file-000.mp4", "episode 0", "[-0.2, 0.5)")


def test_overlapping_ranges_in_one_video_v30(v30, tmp_path, capsys):
    """Episode 1 claims frames [0.3 s, 0.7 s) of a file where episode 0 holds [0, 0.5 s): frame
    order would be scrambled while every count still matches."""
    _v3_rows(v30, lambda rows: _set(rows, 1, **{f"videos/{CAM}/from_timestamp": 0.3,
                                                f"videos/{CAM}/to_timestamp": 0.7}))
    _one_line_refusal(capsys, v30, tmp_path, "file-000.mp4", "episodes 0", "and 1", "overlap")


def test_episode_index_gap_against_declared_total(v21, tmp_path, capsys):
    _episodes_jsonl(v21, lambda rows: _set(rows, 2, episode_index=3))
    shutil.move(v21 / "data/chunk-000/episode_000002.parquet", v21 / "data/chunk-000/episode_000003.parquet")
    shutil.move(v21 / f"videos/chunk-000/{CAM}/episode_000002.mp4", v21 / f"videos/chunk-000/{CAM}/episode_000003.mp4")
    _one_line_refusal(capsys, v21, tmp_path, "info.json", "gaps", "total_episodes is 3")


def test_declared_total_differs(v21, tmp_path, capsys):
    info = json.loads((v21 / "meta/info.json").read_text())
    info["total_episodes"] = 5
    (v21 / "meta/info.json").write_text(json.dumps(info))
    _one_line_refusal(capsys, v21, tmp_path, "info.json", "total_episodes is 5", "lists 3 episodes")


@pytest.mark.parametrize("length", [0, -3])
def test_non_positive_length(v21, tmp_path, capsys, length):
    _episodes_jsonl(v21, lambda rows: _set(rows, 1, length=length))
    _one_line_refusal(capsys, v21, tmp_path, "episode_000001.parquet", f"length {length}")


def test_empty_dataset_v21(v21, tmp_path, capsys):
    (v21 / "meta/episodes.jsonl").write_text("")
    _one_line_refusal(capsys, v21, tmp_path, str(v21), "no episodes")


def test_empty_dataset_v30(v30, tmp_path, capsys):
    _v3_rows(v30, lambda rows: [])
    _one_line_refusal(capsys, v30, tmp_path, str(v30), "no episodes")


# per-episode tables --------------------------------------------------------------------------
def test_frame_index_not_0_to_n(v21, tmp_path, capsys):
    set_table_values(v21 / "data/chunk-000/episode_000002.parquet", "frame_index", {2: 9})
    _one_line_refusal(capsys, v21, tmp_path, "episode_000002.parquet", "frame_index is not 0..5")


def test_timestamp_going_backwards(v21, tmp_path, capsys):
    set_table_values(v21 / "data/chunk-000/episode_000000.parquet", "timestamp", {3: 0.05})
    spec = scan(v21)
    found = check_episode_table(spec, spec.episodes[0], load_episode(spec, spec.episodes[0]))
    assert [(f.kind, f.frame) for f in found] == [("timestamp", 3)]
    _one_line_refusal(capsys, v21, tmp_path, "episode_000000.parquet", "frame 3", "goes backwards")


def test_timestamp_gap_is_a_warning(v21):
    """A jump in timestamps (dropped frames) is reported but does not stop a conversion."""
    set_table_values(v21 / "data/chunk-000/episode_000000.parquet", "timestamp", {4: 0.9})
    spec = scan(v21)
    found = check_episode_table(spec, spec.episodes[0], load_episode(spec, spec.episodes[0]))
    assert [(f.kind, f.severity, f.frame) for f in found] == [("timestamp_gap", "warning", 4)]


def test_rows_of_another_episode(v21):
    set_table_values(v21 / "data/chunk-000/episode_000001.parquet", "episode_index", {2: 0})
    spec = scan(v21)
    with pytest.raises(SourceError, match="episode_000001.parquet: row 2 belongs to episode 0"):
        load_episode(spec, spec.episodes[1])


def test_two_episodes_claiming_one_whole_video(v21, tmp_path, capsys):
    """A video_path template without the episode number makes every episode read the same file."""
    info = json.loads((v21 / "meta/info.json").read_text())
    info["video_path"] = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_000000.mp4"
    (v21 / "meta/info.json").write_text(json.dumps(info))
    _one_line_refusal(capsys, v21, tmp_path, "episode_000000.mp4", "episodes 0 and 1 both claim")


def test_from_timestamp_off_the_frame_grid_is_a_warning(v30):
    _v3_rows(v30, lambda rows: _set(rows, 1, **{f"videos/{CAM}/from_timestamp": 0.54,
                                                f"videos/{CAM}/to_timestamp": 0.94}))
    found = check_dataset(scan(v30, check=False))
    assert [(f.kind, f.severity, f.episode) for f in found] == [("video_range_off_grid", "warning", 1)]
    scan(v30)  # a warning does not stop planning

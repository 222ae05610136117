"""Every bad input gets one line naming the file and the problem, and never a half-written output."""
from __future__ import annotations

import json
import shutil

import pytest

from datakit.cli import main
from datakit.shards.index import load_index
from datakit.synth import encode_video, make_droid_dataset, make_lerobot_dataset, synth_frame

LENGTHS = (8, 12, 6)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("b") / "ds", version="v2.1", episode_lengths=LENGTHS,
                                height=64, width=96, codec="h264")


@pytest.fixture
def ds(base, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(base, dst)
    return dst


def _video(ds, ep=1, cam="observation.images.top"):
    return ds / f"videos/chunk-000/{cam}/episode_{ep:06d}.mp4"


def _run(capsys, src, out, *extra):
    rc = main(["convert", str(src), str(out), "--workers", "1", "--no-progress", *extra])
    cap = capsys.readouterr()
    return rc, cap.err.strip()


def _assert_clean_failure(rc, err, out, *words):
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    if out.exists():
        names = [p.name for p in out.rglob("*")]
        assert "index.json" not in names and not any(n.endswith(".tar.tmp") for n in names), names


def _reencode(path, n, fps=10):
    encode_video(path, [synth_frame(i, 64, 96) for i in range(n)], fps=fps, codec="h264")


CASES = {
    "missing_video": (lambda ds: _video(ds).unlink(), ["episode_000001.mp4", "missing video file"]),
    "truncated_mp4": (lambda ds: _video(ds).write_bytes(_video(ds).read_bytes()[:3000]),
                      ["episode_000001.mp4", "corrupt or truncated"]),
    "corrupt_mp4": (lambda ds: _video(ds).write_bytes(b"\x00junk" * 500), ["episode_000001.mp4", "corrupt or truncated"]),
    "video_shorter": (lambda ds: _reencode(_video(ds), LENGTHS[1] - 3), ["episode_000001.mp4", "shorter than the table"]),
    "video_longer": (lambda ds: _reencode(_video(ds), LENGTHS[1] + 4), ["episode_000001.mp4", "longer than the table"]),
    "fps_mismatch": (lambda ds: _reencode(_video(ds), LENGTHS[1], fps=20), ["episode_000001.mp4", "fps 20"]),
    "unreadable_parquet": (lambda ds: (ds / "data/chunk-000/episode_000001.parquet").write_bytes(b"not parquet"),
                           ["episode_000001.parquet", "unreadable parquet"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_episode_errors_fail_or_skip(ds, tmp_path, capsys, case):
    mutate, words = CASES[case]
    mutate(ds)
    out = tmp_path / "out"
    rc, err = _run(capsys, ds, out)
    _assert_clean_failure(rc, err, out, *words)
    # --on-error skip: the other episodes convert; the bad one is recorded with its reason
    out2 = tmp_path / "out2"
    rc = main(["convert", str(ds), str(out2), "--workers", "1", "--no-progress", "--on-error", "skip"])
    printed = capsys.readouterr().out
    assert rc == 0
    idx = load_index(out2)
    assert [e.episode_index for e in idx.episodes] == [0, 2]
    assert len(idx.skipped) == 1 and idx.skipped[0]["episode_index"] == 1
    assert words[0] in idx.skipped[0]["reason"] and words[1] in idx.skipped[0]["reason"]
    assert "skipped episodes" in printed and "1" in printed
    assert main(["verify", str(out2)]) == 0


def test_video_one_frame_short_is_tolerated(ds, tmp_path, capsys):
    _reencode(_video(ds), LENGTHS[1] - 1)
    rc, err = _run(capsys, ds, tmp_path / "out")
    assert rc == 0, err
    assert load_index(tmp_path / "out").num_frames == sum(LENGTHS)


def test_unknown_codebase_version(ds, tmp_path, capsys):
    info = json.loads((ds / "meta/info.json").read_text())
    info["codebase_version"] = "v9.9"
    (ds / "meta/info.json").write_text(json.dumps(info))
    rc, err = _run(capsys, ds, tmp_path / "out")
    _assert_clean_failure(rc, err, tmp_path / "out", "info.json", "unknown codebase_version")


def test_missing_info_json(ds, tmp_path, capsys):
    (ds / "meta/info.json").unlink()
    rc, err = _run(capsys, ds, tmp_path / "out")
    _assert_clean_failure(rc, err, tmp_path / "out", "info.json", "missing meta/info.json")


def test_unreadable_h5(tmp_path, capsys):
    src = make_droid_dataset(tmp_path / "droid", episode_lengths=(5, 6), height=64, width=96)
    h5 = sorted(src.rglob("trajectory.h5"))[0]
    h5.write_bytes(b"garbage")
    rc, err = _run(capsys, src, tmp_path / "out")
    _assert_clean_failure(rc, err, tmp_path / "out", "trajectory.h5", "unreadable h5")


def test_output_folder_holding_something_else(ds, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, err = _run(capsys, ds, out)
    _assert_clean_failure(rc, err, out, str(out), "holds other files", "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


def test_rerun_with_other_options_is_refused(ds, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(capsys, ds, out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, err = _run(capsys, ds, out, "--layout", "nv12")
    assert rc == 2 and len(err.splitlines()) == 1 and "other options" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the finished output is untouched


def test_failed_run_can_be_resumed_with_skip(ds, tmp_path, capsys):
    """A run stopped by a bad episode can be rerun with --on-error skip into the same folder."""
    _video(ds, ep=2).unlink()
    out = tmp_path / "out"
    assert _run(capsys, ds, out, "--shard-size", "1")[0] == 2
    assert (out / "shard-000000.tar").exists() and not (out / "index.json").exists()
    rc, err = _run(capsys, ds, out, "--shard-size", "1", "--on-error", "skip")
    assert rc == 0, err
    idx = load_index(out)
    assert [e.episode_index for e in idx.episodes] == [0, 1] and idx.skipped[0]["episode_index"] == 2


def test_auto_decoder_falls_back(ds, tmp_path, monkeypatch):
    """A backend ranked first that cannot read the stream is skipped; the next one decodes."""
    from datakit import decoders

    monkeypatch.setitem(decoders.BACKENDS, "broken", "tests.fixtures.fake_backends")
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"conversion": {"h264": ["broken", "torchcodec"]}}))  # a conversion ranking
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(rec))
    assert decoders.backend_order("h264")[:2] == ["broken", "torchcodec"]
    dec = decoders.open_decoder(_video(ds), "auto")
    assert dec.backend == "torchcodec"
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert

    s = convert(ds, tmp_path / "out", ConvertConfig(workers=1, progress=False))
    assert s.decoders == {"torchcodec": 9}  # 3 episodes x 3 video cameras (one of them black)


def test_debug_shows_the_failed_episodes_traceback(ds, tmp_path, capsys):
    """Errors travel as exceptions: with --debug the episode's own traceback is shown (fail:
    raised with its frames; skip: printed per skipped episode)."""
    _video(ds).unlink()
    with pytest.raises(Exception) as info:
        main(["--debug", "convert", str(ds), str(tmp_path / "a"), "--workers", "1", "--no-progress"])
    assert "episode_000001.mp4" in str(info.value)
    frames = [f.name for f in info.traceback]
    assert "load_lerobot_episode" in frames, frames  # where the bad input was found
    capsys.readouterr()
    assert main(["--debug", "convert", str(ds), str(tmp_path / "b"), "--workers", "1", "--no-progress",
                 "--on-error", "skip"]) == 0
    err = capsys.readouterr().err
    assert "skipped episode 1:" in err and "Traceback" in err and "load_lerobot_episode" in err, err


def test_episode_error_crosses_process_boundaries(ds, tmp_path, capsys):
    """With a process pool the bad episode's error (an exception, pickled) still names the file."""
    _video(ds).unlink()
    rc = main(["convert", str(ds), str(tmp_path / "a"), "--workers", "2", "--shard-size", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    _assert_clean_failure(rc, err, tmp_path / "a", "episode_000001.mp4", "missing video file")


def test_summary_prints_paths_with_brackets_verbatim(base, tmp_path, capsys):
    """Reasons hold source paths (and come from OUT): printed as text, never as rich markup."""
    import io

    from rich.console import Console

    from datakit.commands.summary import print_summary

    ds = tmp_path / "x[red]y"
    shutil.copytree(base, ds)
    _video(ds).unlink()
    assert main(["convert", str(ds), str(tmp_path / "o"), "--workers", "1", "--no-progress", "--on-error", "skip"]) == 0
    console = Console(width=1000, record=True, file=io.StringIO())
    print_summary(load_index(tmp_path / "o"), console=console)
    assert "x[red]y/videos" in console.export_text()


def test_nonfinite_keep_flags_the_values_in_the_index(ds, tmp_path, capsys):
    """--nonfinite keep: the episode is converted, its NaN/inf left out of the statistics and
    counted per dimension under stats.state.nonfinite (oracle: numpy on the parquet)."""
    import numpy as np
    import pyarrow.parquet as pq

    from datakit.synth.damage import set_table_values

    table = ds / "data/chunk-000/episode_000001.parquet"
    rows = pq.read_table(table)["observation.state"].to_pylist()
    rows[2][1], rows[5][1], rows[5][3] = float("nan"), float("inf"), float("nan")
    set_table_values(table, "observation.state", {2: rows[2], 5: rows[5]})
    rc, err = _run(capsys, ds, tmp_path / "a")
    assert rc == 2 and "episode 1" in err, err  # rejected by default
    rc, err = _run(capsys, ds, tmp_path / "b", "--nonfinite", "keep")
    assert rc == 0, err
    idx = load_index(tmp_path / "b")
    state = np.concatenate([np.asarray(pq.read_table(ds / f"data/chunk-000/episode_{e:06d}.parquet")
                                       ["observation.state"].to_pylist(), np.float64) for e in range(3)])
    assert idx.stats["state"]["nonfinite"] == (~np.isfinite(state)).sum(0).tolist()
    assert "nonfinite" not in idx.stats["action"]
    assert idx.num_episodes == 3

"""No silent bad values in state/action: NaN, +-inf and float64 values outside float32 range
are rejected by default naming the column, episode and frame; with nonfinite="keep" they are
left out of the statistics (counted) and index.json stays strict JSON. Rows of different
widths, null rows and a width other than the declared one are errors. The per-frame json
`task` follows the frame's task_index."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from datakit.cli import main
from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.errors import SourceError
from datakit.shards.stats import STAT_NAMES, finite_vector_stats
from datakit.sources import load_episode, scan
from datakit.sources.checks import check_episode_table
from datakit.synth import make_lerobot_dataset
from datakit.synth.damage import nonfinite_positions, set_table_values, widen_float64

LENGTHS = (6, 5)
STATE = "observation.state"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("v") / "ds", version="v2.1", episode_lengths=LENGTHS,
                                cameras=("observation.images.top",), blank_cameras=(), height=64, width=96,
                                codec="h264", state_dim=4, action_dim=3)


@pytest.fixture
def ds(base, tmp_path):
    return shutil.copytree(base, tmp_path / "ds")


def _parquet(ds, ep):
    return ds / f"data/chunk-000/episode_{ep:06d}.parquet"


def _row(ds, ep, col, t):
    return pq.read_table(_parquet(ds, ep))[col].to_pylist()[t]


def _convert_err(ds, out, capsys):
    rc = main(["convert", str(ds), str(out), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("value, col, what", [(float("nan"), STATE, "not finite"),
                                              (float("-inf"), "action", "not finite"),
                                              (1e300, STATE, "outside float32 range")])
def test_bad_value_rejects_episode_naming_column_episode_frame(ds, tmp_path, capsys, value, col, what):
    widen_float64(_parquet(ds, 1), col)
    row = _row(ds, 1, col, 3)
    row[2] = value
    set_table_values(_parquet(ds, 1), col, {3: row})
    rc, err = _convert_err(ds, tmp_path / "out", capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    name = "motor_2"  # the declared names of the column (synth: motor_i)
    for word in ("episode_000001.parquet", "episode 1", "frame 3", repr(name), what):
        assert word in err, (word, err)
    assert not (tmp_path / "out" / "index.json").exists()


def test_keep_excludes_bad_values_from_stats_and_index_is_strict_json(ds, tmp_path):
    widen_float64(_parquet(ds, 0), STATE)
    planted = {1: float("nan"), 4: 1e300}
    for t, v in planted.items():
        row = _row(ds, 0, STATE, t)
        row[0] = v
        set_table_values(_parquet(ds, 0), STATE, {t: row})
    spec = scan(ds)
    table = load_episode(spec, spec.episodes[0])
    assert nonfinite_positions(table.state) == [(1, 0), (4, 0)]  # the oracle sees what was planted
    found = check_episode_table(spec, spec.episodes[0], table, nonfinite="keep")
    assert [(f.kind, f.severity, f.frame) for f in found] == [("nonfinite", "warning", 1)]
    cfg = ConvertConfig(workers=1, progress=False)
    cfg.nonfinite = "keep"  # the config field is wired by the config owner; convert reads it with getattr
    convert(ds, tmp_path / "out", cfg)
    text = (tmp_path / "out" / "index.json").read_text()

    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")
    idx = json.loads(text, parse_constant=refuse)
    # oracle: numpy over the finite float32 values of every episode
    with np.errstate(over="ignore"):  # 1e300 -> inf in float32, as stored in the shards
        all_state = np.concatenate([np.asarray(pq.read_table(_parquet(ds, e))[STATE].to_pylist(), np.float64)
                                    for e in range(len(LENGTHS))]).astype(np.float32).astype(np.float64)
    col0 = all_state[np.isfinite(all_state[:, 0]), 0]
    assert idx["stats"]["state"]["mean"][0] == pytest.approx(col0.mean(), rel=1e-9)
    assert idx["stats"]["state"]["max"][0] == pytest.approx(col0.max(), rel=1e-9)


def test_finite_stats_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3))
    x[[3, 7], 1] = [np.nan, np.inf]
    x[:, 2] = np.nan  # a dimension with no finite value at all
    stats, excluded = finite_vector_stats(x)
    assert excluded == [0, 2, 50]
    assert stats["mean"][0] == pytest.approx(x[:, 0].mean()) and stats["std"][0] == pytest.approx(x[:, 0].std())
    good = np.delete(x[:, 1], [3, 7])
    assert stats["mean"][1] == pytest.approx(good.mean()) and stats["q99"][1] == pytest.approx(np.quantile(good, 0.99))
    assert all(stats[k][2] == 0.0 for k in STAT_NAMES)
    assert all(np.isfinite(v) for k in STAT_NAMES for v in stats[k])


def test_rows_of_different_widths_are_an_error(ds):
    """Row widths 4,3,5,4,...: the total is a multiple of the row count, so a flat reshape would
    silently shift values between frames."""
    r1, r2 = _row(ds, 0, STATE, 1), _row(ds, 0, STATE, 2)
    set_table_values(_parquet(ds, 0), STATE, {1: r1[:3], 2: r2 + [0.5]})
    spec = scan(ds)
    with pytest.raises(SourceError, match=r"episode_000000.parquet: .*different lengths.*row 1 has 3"):
        load_episode(spec, spec.episodes[0])


def test_null_row_is_an_error(ds):
    set_table_values(_parquet(ds, 1), "action", {2: None})
    spec = scan(ds)
    with pytest.raises(SourceError, match=r"episode_000001.parquet: column 'action' is null in row 2"):
        load_episode(spec, spec.episodes[1])


def test_width_other_than_declared_is_an_error(ds, tmp_path, capsys):
    info = json.loads((ds / "meta/info.json").read_text())
    info["features"][STATE]["shape"] = [5]
    info["features"][STATE]["names"] = [f"j{i}" for i in range(5)]
    (ds / "meta/info.json").write_text(json.dumps(info))
    rc, err = _convert_err(ds, tmp_path / "out", capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "episode_000000.parquet" in err, err
    assert "state has shape (6, 4)" in err and "declares 5" in err, err


def test_per_frame_task_follows_task_index(ds, tmp_path):
    """Episode 0 switches from task 0 to task 1 at frame 3: each frame's json says its own task."""
    set_table_values(_parquet(ds, 0), "task_index", {t: 1 for t in range(3, LENGTHS[0])})
    tasks = {json.loads(line)["task_index"]: json.loads(line)["task"]
             for line in (ds / "meta/tasks.jsonl").read_text().splitlines()}
    convert(ds, tmp_path / "out", ConvertConfig(workers=1, progress=False))
    samples = [s for shard in sorted((tmp_path / "out").glob("*.tar"))
               for s in wds.WebDataset(str(shard), shardshuffle=False, empty_check=False)]
    metas = [json.loads(s["json"]) for s in samples if json.loads(s["json"])["episode_index"] == 0]
    assert [m["task_index"] for m in metas] == [0, 0, 0, 1, 1, 1]
    assert [m["task"] for m in metas] == [tasks[m["task_index"]] for m in metas]
    assert tasks[0] != tasks[1]


def test_task_index_outside_the_task_list_is_an_error(ds):
    set_table_values(_parquet(ds, 1), "task_index", {4: 7})
    spec = scan(ds)
    found = check_episode_table(spec, spec.episodes[1], load_episode(spec, spec.episodes[1]))
    assert [(f.kind, f.episode, f.frame) for f in found] == [("task_index", 1, 4)]

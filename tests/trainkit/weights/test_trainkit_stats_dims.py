"""Statistics and robots of the dims the model takes (issue 26, item 6): refused at launch in one
line naming the file and the key, exit 2, before step 0.

- The dataset's state / action channels at most the model's (`Family.robot_dims`: pi05's
  max_state_dim and action_dim, GR00T's and DreamZero's state_dim and action_dim), whether the
  model's come from the preset, a setting or model.init_from's checkpoint. Positive control: without
  the check, pi05 with more action channels than the model passes the launch and dies in the first
  forward with a traceback.
- A checkpoint's statistics have the dataset's channels, every statistic the file holds (one of
  another size was dropped silently before), named as the file names it.
- A dataset's own statistics have its channels (datakit's index check, end to end).
The finite / std / quantile rules are tests/trainkit/weights/test_trainkit_init_from_damage.py's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_trainkit_init_from import export, random_tiny
from test_trainkit_init_from_damage import STATE_FILE, refused, with_stats
from trainkit_fixtures import shards_rgb  # noqa: F401 - fixture
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(120)
DIMS = 6  # state and action channels of shards_rgb


def _refused_run(capsys, shards: Path, out: Path, *sets: str, config: Path = TINY) -> str:
    from trainkit.cli import main

    base = (f"data.shards={shards}", f"output.dir={out}", "output.progress=false", "data.num_workers=0",
            "train.steps=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    code = main(["run", str(config), *[a for s in (*base, *sets) for a in ("--set", s)]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (out / "metrics.jsonl").exists(), err
    return err


@pytest.mark.parametrize("setting, says", [
    ("model.action_dim=4", f"action_names has {DIMS} channels; the model takes at most 4 (model.action_dim)"),
    ("model.max_state_dim=5", f"state_names has {DIMS} channels; the model takes at most 5 (model.max_state_dim)"),
], ids=["action", "state"])
def test_a_robot_with_more_channels_than_the_model_is_refused(shards_rgb, tmp_path, capsys, setting, says):  # noqa: F811
    err = _refused_run(capsys, shards_rgb, tmp_path / "run", setting)
    assert err == f"trainkit: {shards_rgb}/index.json: {says}", err


def test_the_bound_from_a_checkpoint_names_it(shards_rgb, tmp_path, capsys):  # noqa: F811
    """A checkpoint of 4 action channels (action_in_proj's columns) and a 6-channel robot."""
    from trainkit.models import build_model

    model = build_model("pi05", "tiny", {"action_dim": 4})
    folder = export(model, tmp_path / "ckpt")
    err = _refused_run(capsys, shards_rgb, tmp_path / "run", f"model.init_from={folder}")
    assert err.endswith("the model takes at most 4 (model.action_dim from model.init_from's checkpoint)"), err


def test_without_the_check_pi05_fails_at_step_0_with_a_traceback(shards_rgb, tmp_path, monkeypatch):  # noqa: F811
    """Positive control: the same launch with the check taken out gets past every launch check and
    dies in the first forward (GR00T and DreamZero refuse there too, after the model is built)."""
    import trainkit.train
    from trainkit.cli import main

    monkeypatch.setattr(trainkit.train, "check_robot_dims", lambda *a, **k: None)
    sets = (f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}", "output.progress=false",
            "data.num_workers=0", "train.steps=1", "parallel.fsdp=none", "parallel.ac_stride={}", "model.action_dim=4")
    with pytest.raises(RuntimeError, match="must match the size"):
        main(["run", str(TINY), *[a for s in sets for a in ("--set", s)]])


@pytest.mark.parametrize("config", ["gr00t_tiny.toml", "dreamzero_tiny.toml"])
def test_gr00t_and_dreamzero_bound_state_and_action(shards_rgb, tmp_path, capsys, config):  # noqa: F811
    err = _refused_run(capsys, shards_rgb, tmp_path / "run", "model.state_dim=4", config=TINY.parent / config)
    assert err.endswith(f"state_names has {DIMS} channels; the model takes at most 4 (model.state_dim)"), err


def test_checkpoint_statistics_of_another_size_are_refused_naming_the_key(shards_rgb, tmp_path, capsys):  # noqa: F811
    def short(part: str, stat: str):
        return lambda stats: stats[part].__setitem__(stat, stats[part][stat][:-1])

    model = random_tiny()
    # a statistic quantile normalisation does not read: dropped without a word before
    folder = with_stats(export(model, tmp_path / "a"), shards_rgb, short("action", "mean"))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run_a", "data.norm_from=checkpoint")
    assert f"trainkit: {folder / STATE_FILE}: action.mean has {DIMS - 1} values; the dataset's action has {DIMS}" \
           in err, err
    folder = with_stats(export(model, tmp_path / "b"), shards_rgb, short("state", "q99"))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run_b", "data.norm_from=checkpoint")
    assert f"{folder / STATE_FILE}: observation.state.q99 has {DIMS - 1} values" in err, err


def test_openpi_statistics_of_another_size_are_refused_naming_the_key(shards_rgb, tmp_path, capsys):  # noqa: F811
    from datakit.shards.index import load_index

    folder = export(random_tiny(), tmp_path / "ckpt")
    stats = load_index(shards_rgb).stats
    path = folder / "assets" / "robot" / "norm_stats.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"norm_stats": {"state": {**stats["state"], "std": stats["state"]["std"][:3]},
                                               "actions": stats["action"]}}))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run", "data.norm_from=checkpoint", "data.norm=mean_std")
    assert f"trainkit: {path}: norm_stats.state.std has 3 values; the dataset's state has {DIMS}" in err, err


def test_dataset_statistics_of_another_size_are_refused_naming_the_key(shards_rgb, tmp_path, capsys):  # noqa: F811
    shards = tmp_path / "shards"
    shutil.copytree(shards_rgb, shards)
    index = json.loads((shards / "index.json").read_text())
    index["stats"]["state"]["q01"] = index["stats"]["state"]["q01"][:4]
    (shards / "index.json").write_text(json.dumps(index))
    err = _refused_run(capsys, shards, tmp_path / "run")
    assert f"{shards / 'index.json'}" in err and "stats.state.q01" in err, err

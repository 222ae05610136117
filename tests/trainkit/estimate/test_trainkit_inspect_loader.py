"""`trainkit inspect`'s loader section (trainkit/estimate/loader.py): what a run asks of the data
plan. Oracles: the trainer's own LoaderConfig (`TrainData.cfg`, built as `trainkit run` builds it),
the TOML it writes read back by datakit, and `datakit plan` run on that file with the printed line."""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import torch

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture

from datakit.cli import main as datakit
from datakit.loader import loader_config_from_toml
from trainkit.cli import main as trainkit
from trainkit.config import load_config
from trainkit.data import TrainData, read_run_shards
from trainkit.estimate.loader import loader_needs
from trainkit.models import build_config, family
from trainkit.parallel import compute_dtype
from trainkit.validation import holdout

pytestmark = pytest.mark.timeout(180)
CONFIGS = Path(__file__).resolve().parents[3] / "trainkit" / "configs"


def test_with_shards_it_is_the_trainers_loader_config(shards_rgb):  # noqa: F811
    sets = [f"data.shards={shards_rgb}", "data.val_fraction=0.25", "train.global_batch=16"]
    cfg = load_config(CONFIGS / "pi05_tiny.toml", sets, required=False)
    needs, loader = loader_needs(cfg, world_size=2)
    fam, model_cfg = family("pi05"), build_config("pi05", "tiny", {})
    shards = read_run_shards(cfg.data, fam.max_slots(model_cfg))
    train = holdout(cfg.data, shards.index).train
    data = TrainData(cfg.data, shards, fam, model_cfg, seed=cfg.train.seed, rank=0, world_size=2, micro_batch=4,
                     device=torch.device("cpu"), image_dtype=compute_dtype(cfg.parallel), global_batch=16,
                     episodes=train)
    assert loader == dataclasses.replace(data.cfg, pin_memory=True)  # inspect speaks for the run on a GPU
    assert (loader.batch_size, loader.epoch_batch, loader.world_size, loader.episodes) == (4, 16, 2, train)
    assert loader.action_horizon == model_cfg.horizon and loader.resize == (16, 16)  # frames stored at 32x64
    assert needs["index"] == str(shards_rgb) and needs["depends_on_data"] == []
    assert needs["config"] == dataclasses.asdict(loader)


def test_the_written_toml_and_the_printed_plan_line_run_datakit_plan(shards_rgb, tmp_path, capsys):  # noqa: F811
    toml = tmp_path / "loader.toml"
    assert trainkit(["inspect", str(CONFIGS / "pi05_tiny.toml"), "--set", f"data.shards={shards_rgb}",
                     "--world-size", "2", "--loader-toml", str(toml), "--samples-per-s", "50"]) == 0
    out = capsys.readouterr().out
    line = f"datakit plan {shards_rgb} --loader-config {toml} --samples-per-s 50 --ranks 2"
    assert f"  {line}\n" in out + "\n" and f"loader (rank 0 of 2, from the index of {shards_rgb})" in out
    cfg = load_config(CONFIGS / "pi05_tiny.toml", [f"data.shards={shards_rgb}"], required=False)
    assert loader_config_from_toml(toml) == loader_needs(cfg, world_size=2)[1]
    assert datakit([*shlex.split(line)[1:], "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["batch_size"], plan["ranks"], plan["samples_per_s"]) == (4, 2, 50)


def test_without_shards_it_says_what_the_data_decides(shards_3cam, tmp_path, capsys):  # noqa: F811
    pi05 = load_config(CONFIGS / "pi05_tiny.toml", ["data.shards=", "data.val_episodes=[1]"], required=False)
    needs, loader = loader_needs(pi05)
    assert needs["index"] is None and needs["depends_on_data"] == ["slots", "resize", "episodes"]
    assert (loader.slots, loader.resize, loader.episodes, loader.action_horizon) == ((), (16, 16), None, 50)
    # dreamzero tiles three views: with no slots named, the index's cameras (checked to be 3 by the loader)
    toml = tmp_path / "dz.toml"
    assert trainkit(["inspect", str(CONFIGS / "dreamzero_tiny.toml"), "--set", f"data.shards={tmp_path / 'none'}",
                     "--loader-toml", str(toml)]) == 0
    out = capsys.readouterr().out
    assert "without the shard index" in out and "the data decides slots, resize" in out
    dz = loader_config_from_toml(toml)
    model = build_config("dreamzero", "tiny", {})
    assert (dz.tile, dz.slots, dz.prune_slots, len(dz.frame_offsets)) == ("wrist_top", (), False, model.frames)
    assert datakit(["plan", str(shards_3cam), "--loader-config", str(toml), "--samples-per-s", "10", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["kept_slots_per_step"] == 3 and plan["batch_size"] == 8


def test_json_has_the_loader_and_an_unbuildable_preset_is_one_line(tmp_path, capsys):
    dz = str(CONFIGS / "dreamzero_tiny.toml")
    assert trainkit(["inspect", dz, "--json", "--set", "data.slots=['a', 'b']"]) == 0
    loader = json.loads(capsys.readouterr().out)["loader"]
    assert "dreamzero tiles 3 views" in loader["error"] and loader["plan"].startswith("datakit plan shards ")
    assert trainkit(["inspect", dz, "--set", "data.slots=['a', 'b']"]) == 0
    assert "loader: cannot build the run's LoaderConfig: data.slots: dreamzero tiles 3 views" in capsys.readouterr().out
    assert trainkit(["inspect", dz, "--set", "data.slots=['a', 'b']", "--loader-toml", str(tmp_path / "x.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainkit: --loader-toml {tmp_path / 'x.toml'}: data.slots:") and err.count("\n") == 1
    assert not (tmp_path / "x.toml").exists()
    assert trainkit(["inspect", dz, "--samples-per-s", "0"]) == 2
    assert "--samples-per-s: must be > 0" in capsys.readouterr().err

"""Bad input fails before any GPU work with one line naming the culprit (exit code 2 from the
CLI): a folder that is not datakit output, a slot naming a camera the shards lack, a world size
that does not divide the global batch, a preset over a stated memory cap. Plus the plain
single-process `trainkit run` path end to end (no torchrun), which writes metrics.jsonl."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.cli import main
from trainkit.estimate.inspect import inspect_model
from trainkit.estimate.loader import loader_needs
from trainkit.config import load_config

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "trainkit" / "configs" / "pi05_tiny.toml")


def _run(capsys, *overrides):
    code = main(["run", TINY, *[a for o in overrides for a in ("--set", o)]])
    return code, capsys.readouterr().err.strip()


def test_a_folder_that_is_not_datakit_output(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard-000000.tar").write_bytes(b"not a tar")
    code, err = _run(capsys, f"data.shards={data}", f"output.dir={tmp_path / 'o'}")
    assert code == 2 and err.startswith(f"trainkit: {data}: not a finished datakit shard folder"), err
    assert not (tmp_path / "o").exists()


def test_a_slot_naming_a_missing_camera(shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = _run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path}",
                     'data.slots=["observation.images.top", "observation.images.belly"]')
    assert code == 2 and "names camera 'observation.images.belly', which the shards lack" in err, err


def test_a_global_batch_larger_than_the_dataset(shards_rgb, tmp_path, capsys):  # noqa: F811
    # 81 samples in the fixture (episodes of 24 + 31 + 17 + 9 frames): one process, 4 x 24 micro-batches
    code, err = _run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "train.global_batch=96",
                     "train.micro_batch=24", "parallel.fsdp=none")
    want = f"trainkit: {shards_rgb}: 81 samples cannot fill one global batch of 96 (epoch_batch)"
    assert code == 2 and err == want, err


def test_a_world_size_that_does_not_divide_the_global_batch(shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("WORLD_SIZE", "4")
    code, err = _run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "train.global_batch=18",
                     "train.micro_batch=2")
    assert code == 2 and "train.global_batch=18 is not divisible by the world size 4" in err, err


def test_a_preset_over_the_memory_cap_reports_the_estimate(shards_rgb, tmp_path, capsys):  # noqa: F811
    over = [f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "model.preset=full", "train.micro_batch=32",
            "train.memory_cap_gib=40"]
    estimate = inspect_model(load_config(TINY, over), world_size=1)["memory"]["peak_gib"]
    assert estimate > 40  # the oracle: inspect's own estimate, printed by the error
    code, err = _run(capsys, *over)
    assert code == 2 and f"estimated peak memory {estimate:.1f} GiB per GPU exceeds train.memory_cap_gib=40" in err, err


def test_unknown_preset(shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = _run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "model.preset=huge")
    assert code == 2 and err.startswith("trainkit: unknown pi05 preset 'huge'"), err


def test_unknown_config_key_from_the_command_line(capsys):
    code, err = _run(capsys, "parallel.fsdp_mode=block")
    assert code == 2 and err.startswith("trainkit: parallel.fsdp_mode: unknown key"), err


@pytest.mark.timeout(120)
def test_single_process_run_without_torchrun(shards_rgb, tmp_path):  # noqa: F811
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "trainkit.cli", "run", TINY, "--set", f"data.shards={shards_rgb}",
                           "--set", f"output.dir={tmp_path}", "--set", "train.steps=4", "--set", "output.log_every=2"],
                          capture_output=True, text=True, env=env, timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "step"] == [0, 1, 2, 3]
    intervals = [x for x in lines if x["kind"] == "interval"]
    # one rank: FSDP2 has nothing to gather and issues no collective (counted, not assumed)
    assert len(intervals) == 2 and all(x["all_gathers_per_step"] == 0 for x in intervals)
    assert "loss" in proc.stdout + proc.stderr


def test_inspect_command_prints_the_report_of_inspect_model(capsys):
    """`trainkit inspect CONFIG --json` is wired to trainkit.estimate.inspect (the oracle: calling it directly),
    needs no shard folder and honours --set and --world-size."""
    code = main(["inspect", str(ROOT / "trainkit" / "configs" / "pi05_optimised.toml"), "--json", "--world-size", "2",
                 "--set", "train.micro_batch=8"])
    printed = json.loads(capsys.readouterr().out)
    cfg = load_config(ROOT / "trainkit" / "configs" / "pi05_optimised.toml", ["train.micro_batch=8"])
    loader = printed.pop("loader")  # the loader section: trainkit/estimate/loader.py (tests/trainkit/estimate/test_trainkit_inspect_loader.py)
    assert loader == json.loads(json.dumps(loader_needs(cfg, world_size=2)[0]))
    assert code == 0 and printed == json.loads(json.dumps(inspect_model(cfg, world_size=2)))
    assert printed["micro_batch"] == 8 and printed["world_size"] == 2

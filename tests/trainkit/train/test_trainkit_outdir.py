"""output.dir and launch-time input a user can get wrong (issue 14, items 13 and 15): each is one
line naming the key or file, exit 2, and nothing written.

- One run per output.dir: a second `trainkit run` into the folder of a live one is refused naming
  the holder (a real second process holds it; the oracle is its pid), and the lock dies with its
  holder, so the next run starts.
- output.dir equal to or inside data.shards, a file, or under a file.
- A garbage index.json, bad loader words and bad optimiser values through the CLI.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainkit_fixtures import cli_run, shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import ROOT, TINY


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def own_shards(shards_rgb, tmp_path):  # noqa: F811
    """A copy of the fixture shards that a test may let a broken run write into."""
    return shutil.copytree(shards_rgb, tmp_path / "shards")


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("where", ["equal", "inside"])
def test_output_dir_in_the_shard_folder_is_refused(own_shards, capsys, where):
    before = _listing(own_shards)
    out = own_shards if where == "equal" else own_shards / "runs" / "a"
    code, err = cli_run(capsys, f"data.shards={own_shards}", f"output.dir={out}")
    line = _one_line(err)
    assert code == 2 and line.startswith("trainkit: output.dir") and "data.shards" in line, line
    assert _listing(own_shards) == before


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_output_dir_that_is_or_is_under_a_file(shards_rgb, tmp_path, capsys, where):  # noqa: F811
    f = tmp_path / "f"
    f.write_text("x")
    out = f if where == "a_file" else f / "run"
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}")
    line = _one_line(err)
    assert code == 2 and line.startswith(f"trainkit: output.dir {out}") and str(f) in line, line
    assert f.read_text() == "x"


def test_a_garbage_index_json_is_one_line(own_shards, tmp_path, capsys):
    (own_shards / "index.json").write_text("{ not json")
    code, err = cli_run(capsys, f"data.shards={own_shards}", f"output.dir={tmp_path / 'o'}")
    line = _one_line(err)
    assert code == 2 and "index.json" in line, line


@pytest.mark.parametrize("override, key", [
    ("data.shuffle=bogus", "data.shuffle"), ("data.norm=bogus", "data.norm"), ("optim.lr=nan", "optim.lr"),
    ("optim.betas=[1.5, 0.9]", "optim.betas"), ("output.checkpoint_every=-1", "output.checkpoint_every"),
])
def test_bad_values_through_the_cli_are_one_line(shards_rgb, tmp_path, capsys, override, key):  # noqa: F811
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'o'}", override)
    line = _one_line(err)
    assert code == 2 and line.startswith(f"trainkit: {key}: "), line
    assert not (tmp_path / "o").exists()


def _wait_for_steps(out: Path, proc: subprocess.Popen, deadline_s: float) -> None:
    """Until the first run has logged a step (it holds the lock and trains) or died."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and '"kind": "step"' in metrics.read_text():
            return
        if proc.poll() is not None:
            pytest.fail(f"the first run ended first: {proc.communicate()[1][-2000:]}")
        time.sleep(0.2)
    pytest.fail("the first run logged no step in time")


@pytest.mark.timeout(180)
def test_a_second_run_into_a_live_output_dir_is_refused(shards_rgb, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    sets = [f"data.shards={shards_rgb}", f"output.dir={out}", "train.steps=100000", "output.log_every=1",
            "output.progress=false", "data.num_workers=0", "parallel.fsdp=none", "optim.schedule=constant"]
    first = subprocess.Popen([sys.executable, "-m", "trainkit.cli", "run", str(TINY),
                              *[a for s in sets for a in ("--set", s)]],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(out, first, 120)
        code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", "train.steps=2")
        line = _one_line(err)
        assert code == 2 and f"pid {first.pid}" in line and str(out) in line, line
    finally:
        first.kill()
        first.communicate()
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if '"kind": "step"' in x]
    assert steps == list(range(len(steps)))  # only the first run logged
    # the lock died with its holder (kill -9): the next run starts at once
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", "train.steps=1",
                        "parallel.fsdp=none")
    assert code == 0, err

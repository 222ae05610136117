"""Datasets and runs for the trainkit hardening tests, built once per session with the real pipeline.

- `nan_action_shards` / `nan_state_shards`: the loader fixture's dataset (same episodes, cameras and
  videos) with one NaN planted in the parquet, converted with `nonfinite="keep"` (as
  `datakit convert --nonfinite keep` does), so the shards hold it.
- `other_shards`: the same dataset with one finite action value changed: another dataset with the
  same episodes and frame count.
- `base_run`: a tiny run over `shards_rgb` stopped after 4 steps, checkpointed at steps 2 and 4,
  plus the unbroken 6-step run's losses (the oracle of every resume).
Import the fixtures from here, as from test_loader_fixtures.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_loader_fixtures import CAMS, LENGTHS, shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import TINY

NAN_EPISODE, NAN_FRAME = 1, 3  # an action or state value of this frame is NaN
NAN_ROW = sum(LENGTHS[:NAN_EPISODE]) + NAN_FRAME  # its frame-table row
# Samples whose 50-action chunk (clamped to the episode) holds the NaN action: anchors 0..NAN_FRAME
# of the episode.
NAN_ACTION_ANCHORS = set(range(sum(LENGTHS[:NAN_EPISODE]), NAN_ROW + 1))


def _converted(root: Path, column: str, value: float) -> Path:
    import pyarrow.parquet as pq

    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset
    from datakit.synth.damage import set_table_values

    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=LENGTHS, height=32, width=64,
                               cameras=CAMS, blank_cameras=(CAMS[2],))
    table = src / f"data/chunk-000/episode_{NAN_EPISODE:06d}.parquet"
    row = pq.read_table(table)[column].to_pylist()[NAN_FRAME]
    row[1] = value
    set_table_values(table, column, {NAN_FRAME: row})
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=400_000, layout="rgb", nonfinite="keep"))
    return out


@pytest.fixture(scope="session")
def nan_action_shards(tmp_path_factory) -> Path:
    return _converted(tmp_path_factory.mktemp("nan_action"), "action", float("nan"))


@pytest.fixture(scope="session")
def nan_state_shards(tmp_path_factory) -> Path:
    return _converted(tmp_path_factory.mktemp("nan_state"), "observation.state", float("nan"))


@pytest.fixture(scope="session")
def other_shards(tmp_path_factory) -> Path:
    return _converted(tmp_path_factory.mktemp("other"), "action", 0.125)


def cli_run(capsys, *overrides: str) -> tuple[int, str]:
    """`trainkit run pi05_tiny.toml --set ...` in this process: (exit code, stderr stripped)."""
    from trainkit.cli import main

    base = ("output.progress=false", "data.num_workers=0")
    code = main(["run", str(TINY), *[a for o in (*base, *overrides) for a in ("--set", o)]])
    return code, capsys.readouterr().err.strip()


def step_lines(out: Path) -> list[dict]:
    """The per-step records of `out/metrics.jsonl`, read with the stdlib."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == "step"]


@dataclass
class BaseRun:
    shards: Path
    out: Path  # checkpoints/step-000002, step-000004 (the run stopped after 4 of 6 steps)
    unbroken: dict[int, dict]  # step -> metrics.jsonl step line of the same config run to 6 steps unbroken

    def copy(self, dst: Path) -> Path:
        """A copy of the stopped run's folder to resume or damage."""
        shutil.copytree(self.out, dst)
        return dst

    def args(self, out: Path, *extra: str) -> tuple[str, ...]:
        return (f"data.shards={self.shards}", f"output.dir={out}", *COMMON, *extra)


COMMON = ("train.steps=6", "output.checkpoint_every=2", "output.log_every=1", "parallel.fsdp=none")


@pytest.fixture(scope="session")
def base_run(shards_rgb, tmp_path_factory) -> BaseRun:  # noqa: F811
    from trainkit.cli import main

    root = tmp_path_factory.mktemp("base_run")
    run = BaseRun(shards=shards_rgb, out=root / "stopped", unbroken={})
    for out, extra in ((root / "unbroken", ()), (run.out, ("train.steps=4",))):
        sets = ("output.progress=false", "data.num_workers=0", *run.args(out, *extra))
        assert main(["run", str(TINY), *[a for o in sets for a in ("--set", o)]]) == 0
    run.unbroken = {x["step"]: x for x in step_lines(root / "unbroken")}
    assert sorted(run.unbroken) == list(range(6))
    return run

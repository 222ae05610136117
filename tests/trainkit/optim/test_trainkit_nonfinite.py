"""A run never trains on through NaN (issue 14, item 7).

Oracles: the frame-table rows each step trained on (`output.record_samples`, written before the
forward) against the rows whose action chunk holds the planted NaN (known from the fixture);
torch's own DCP-to-torch.save converter reading every checkpoint left behind, to check its
tensors are finite.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from trainkit_fixtures import (NAN_ACTION_ANCHORS, NAN_ROW, cli_run, nan_action_shards, nan_state_shards,  # noqa: F401
                               shards_rgb, step_lines)

pytestmark = pytest.mark.timeout(180)

STEPS = 20  # one epoch of the 81-sample fixture at batch 4: every anchor is drawn once


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _rows_per_step(out: Path, rank: int = 0) -> dict[int, list[int]]:
    """step -> the rows rank `rank` trained on (output.record_samples, written before the forward)."""
    got: dict[int, list[int]] = {}
    for line in (out / f"samples-rank{rank}.jsonl").read_text().splitlines():
        r = json.loads(line)
        got.setdefault(r["step"], []).extend(r["rows"])
    return got


def _checkpoints_are_finite(out: Path, tmp: Path) -> list[str]:
    """Names of the checkpoints left in `out`, each checked finite through torch's own converter."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    names = sorted(p.name for p in (out / "checkpoints").iterdir()) if (out / "checkpoints").exists() else []
    for name in names:
        dst = tmp / f"{name}.pt"
        dcp_to_torch_save(out / "checkpoints" / name, dst)
        state = torch.load(dst, weights_only=False)
        tensors = [v for v in _leaves(state) if isinstance(v, torch.Tensor) and v.is_floating_point()]
        assert tensors and all(bool(torch.isfinite(t).all()) for t in tensors), name
    return names


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _args(shards: Path, out: Path, *extra: str) -> tuple[str, ...]:
    return (f"data.shards={shards}", f"output.dir={out}", f"train.steps={STEPS}", "parallel.fsdp=none",
            "output.log_every=1", "output.checkpoint_every=1", "output.keep_checkpoints=0",
            "output.record_samples=true", *extra)


def _named_rows(line: str, what: str) -> list[int]:
    m = re.search(rf"non-finite {what} in rows \[([\d, ]+)\]", line)
    assert m, line
    return [int(x) for x in m.group(1).split(",")]


def test_a_huge_learning_rate_stops_at_the_first_nonfinite_step(shards_rgb, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    code, err = cli_run(capsys, *_args(shards_rgb, out, "optim.lr=1e30", "optim.warmup_steps=0"))
    line = _one_line(err)
    step = int(re.search(r"step (\d+)", line).group(1))  # the k-th step: index k - 1 in metrics.jsonl
    assert code == 2 and "non-finite" in line and 'train.on_nonfinite="stop"' in line, line
    logged = step_lines(out)
    assert [x["step"] for x in logged] == list(range(step - 1)) and all(math.isfinite(x["loss"]) for x in logged)
    assert _checkpoints_are_finite(out, tmp_path) == [f"step-{s:06d}" for s in range(1, step)]


def test_a_nan_action_stops_the_run_naming_the_step_and_rows(nan_action_shards, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    code, err = cli_run(capsys, *_args(nan_action_shards, out))
    line = _one_line(err)
    rows = _rows_per_step(out)
    first_bad = min(s for s, r in rows.items() if NAN_ACTION_ANCHORS & set(r))
    assert code == 2 and f"step {first_bad + 1}:" in line, (line, first_bad)  # named as the checkpoints count
    flagged = _named_rows(line, "actions")
    assert flagged and set(flagged) <= NAN_ACTION_ANCHORS & set(rows[first_bad]), (flagged, rows[first_bad])
    assert [x["step"] for x in step_lines(out)] == list(range(first_bad))
    assert _checkpoints_are_finite(out, tmp_path) == [f"step-{s:06d}" for s in range(1, first_bad + 1)]


def test_skip_leaves_nonfinite_steps_out_and_counts_them(nan_action_shards, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    code, err = cli_run(capsys, *_args(nan_action_shards, out, "train.on_nonfinite=skip"))
    assert code == 0, err
    rows = _rows_per_step(out)
    bad = sorted(s for s, r in rows.items() if NAN_ACTION_ANCHORS & set(r))
    assert bad and len(rows) == STEPS  # the fixture's NaN is drawn, and every step was taken
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nonfinite_skipped"] == bad
    said = [x for x in err.splitlines() if "skipped" in x]
    assert len(said) == 1 and f"{len(bad)} non-finite step" in said[0], err
    logged = step_lines(out)
    assert [x["step"] for x in logged] == [s for s in range(STEPS) if s not in bad]
    assert all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) for x in logged)
    assert len(_checkpoints_are_finite(out, tmp_path)) == STEPS


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_nan_state_is_the_same_one_line(nan_state_shards, tmp_path, capsys, mode):  # noqa: F811
    out = tmp_path / "run"
    code, err = cli_run(capsys, *_args(nan_state_shards, out, f"train.on_nonfinite={mode}", "train.steps=40"))
    line = _one_line(err)
    done = len(step_lines(out))
    assert code == 2 and f"step {done + 1}:" in line and _named_rows(line, "state") == [NAN_ROW], line


def test_skip_stops_a_run_that_has_diverged(shards_rgb, tmp_path, capsys):  # noqa: F811
    """A huge lr leaves the weights finite but every loss NaN: skipping would skip the whole run."""
    from trainkit.optim.nonfinite import CONSECUTIVE_LIMIT

    out = tmp_path / "run"
    code, err = cli_run(capsys, *_args(shards_rgb, out, "optim.lr=1e30", "optim.warmup_steps=0",
                                       "train.on_nonfinite=skip"))
    line = _one_line(err)
    assert code == 2 and f"{CONSECUTIVE_LIMIT} non-finite steps in a row" in line, line
    step = int(re.search(r"step (\d+)", line).group(1))
    logged = [x["step"] for x in step_lines(out)]
    assert step == logged[-1] + 1 + CONSECUTIVE_LIMIT and all(math.isfinite(x["loss"]) for x in step_lines(out))


@pytest.mark.timeout(240)
def test_two_ranks_take_the_same_decision(nan_action_shards, tmp_path):  # noqa: F811
    """2 gloo ranks, FSDP: "stop" ends both ranks at the first step where either rank's batch holds
    the NaN (no rank left waiting in a collective); "skip" leaves out exactly the steps where one does."""
    from trainkit_harness import run_distributed, tiny_config

    common = (f"train.steps={STEPS}", "output.log_every=1", "output.record_samples=true", "parallel.fsdp=block")
    stop, skip = tmp_path / "stop", tmp_path / "skip"
    results = run_distributed([tiny_config(nan_action_shards, stop, *common),
                               tiny_config(nan_action_shards, skip, *common, "train.on_nonfinite=skip")], world=2)

    def bad_steps(out: Path) -> list[int]:
        rows = [_rows_per_step(out, rank) for rank in (0, 1)]
        return sorted({s for per_rank in rows for s, r in per_rank.items() if NAN_ACTION_ANCHORS & set(r)})

    first_bad = bad_steps(stop)[0]
    assert results[0]["error"].startswith(f"NonFiniteError: step {first_bad + 1}:"), results[0]  # the k-th step
    assert "error" not in results[1], results[1]
    summary = json.loads((skip / "summary.json").read_text())
    assert summary["nonfinite_skipped"] == bad_steps(skip) and summary["nonfinite_skipped"]
    assert sorted(results[1]["losses"]) == [s for s in range(STEPS) if s not in summary["nonfinite_skipped"]]


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_deferred_check_takes_the_same_decisions(nan_action_shards, tmp_path, capsys, mode):  # noqa: F811
    """`train.nonfinite_check=deferred` (no host sync a step; fused AdamW's found_inf skips on the
    device, the host reads the verdict a step later): the same steps are left out or named as the
    synchronous check's, no metrics line for them, and every update that ran was finite."""
    out = tmp_path / "run"
    code, err = cli_run(capsys, f"data.shards={nan_action_shards}", f"output.dir={out}", f"train.steps={STEPS}",
                        "parallel.fsdp=none", "output.log_every=4", "output.record_samples=true",
                        "train.nonfinite_check=deferred", "optim.fused=true", "train.ema_decay=0.9",
                        f"train.on_nonfinite={mode}")
    rows = _rows_per_step(out)
    bad = sorted(s for s, r in rows.items() if NAN_ACTION_ANCHORS & set(r))
    logged = step_lines(out)
    assert bad and all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) for x in logged)
    if mode == "stop":
        line = _one_line(err)
        assert code == 2 and f"step {bad[0] + 1}:" in line and 'train.on_nonfinite="stop"' in line, line
        assert [x["step"] for x in logged] == list(range(bad[0]))
        return
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["nonfinite_skipped"] == bad
    assert [x["step"] for x in logged] == [s for s in range(STEPS) if s not in bad]


def test_deferred_check_needs_fused_adamw(shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}", "train.steps=1",
                        "train.nonfinite_check=deferred", "optim.fused=false")
    assert code == 2 and "train.nonfinite_check" in _one_line(err) and "optim.fused" in err, err

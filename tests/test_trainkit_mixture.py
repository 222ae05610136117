"""trainkit run on a weighted mixture of two generated datasets that differ in camera names (each
source maps its own cameras to the model's slots) and in state/action sizes (6/6 and 4/3): the
tiny pi05 preset trains with falling loss and logs the loss per source (issue 27).

Oracles: the step loss itself (with one metric line per step, the per-source means weighted by
their sample counts are the step's mean loss, pi05's samples being of one size), the global batch
(the counts add up to it) and the run's own summary.json (the table's per-source rows).
"""
import json
import math

import pytest

from test_loader_fixtures import shards_b, shards_rgb  # noqa: F401 - session fixtures (b: other cameras, 4 state / 3 action)
from trainkit_harness import tiny_config

STEPS = 12


@pytest.fixture(scope="module")
def mixture_run(shards_rgb, shards_b, tmp_path_factory):  # noqa: F811
    from trainkit.train import run

    out = tmp_path_factory.mktemp("mixture") / "run"
    sources = (f'[{{shards = "{shards_rgb}", weight = 0.7, name = "sim"}}, '
               f'{{shards = "{shards_b}", weight = 0.3, slots = ["cam.hand", "", "cam.front"]}}]')
    cfg = tiny_config(shards_rgb, out, f"data.sources={sources}", f"train.steps={STEPS}", "output.log_every=1",
                      "parallel.fsdp=none", "parallel.ac_stride={}", "optim.schedule=constant")
    result = run(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return result, rows, out


def test_a_mixture_trains_with_falling_loss(mixture_run):
    result, _, _ = mixture_run
    losses = [result.losses[s] for s in range(STEPS)]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses


def test_each_log_step_holds_the_loss_of_each_source(mixture_run):
    result, rows, _ = mixture_run
    steps = {r["step"]: r for r in rows if r["kind"] == "step"}
    intervals = [r for r in rows if r["kind"] == "interval"]
    assert [r["step"] for r in intervals] == list(range(STEPS))
    shares = {"sim": 0, "out": 0}  # shards_b's folder is named out: its default name
    for r in intervals:
        counts = {name: r[f"samples/{name}"] for name in shares}
        assert sum(counts.values()) == 4  # the global batch
        mean = sum(r[f"loss/{name}"] * n for name, n in counts.items() if n) / 4
        assert mean == pytest.approx(steps[r["step"]]["loss"], rel=1e-5)
        shares = {name: shares[name] + n for name, n in counts.items()}
    assert all(abs(shares[name] - w * 4 * STEPS) <= 1 for name, w in (("sim", 0.7), ("out", 0.3))), shares
    by_source = result.summary["source_loss"]
    assert set(by_source) == {"sim", "out"}
    for name, loss in by_source.items():
        first = next(r[f"loss/{name}"] for r in intervals if f"loss/{name}" in r)
        last = next(r[f"loss/{name}"] for r in reversed(intervals) if f"loss/{name}" in r)
        assert loss == {"first": first, "last": last}
        assert last < first  # each source learns


def test_the_summary_table_shows_the_loss_per_source(mixture_run, capsys):
    from trainkit.observe.summary import format_summary

    _, _, out = mixture_run
    table = format_summary(json.loads((out / "summary.json").read_text()))
    assert [line.split()[0] for line in table.splitlines() if line.startswith("  ") and "->" in line] == ["sim", "out"]

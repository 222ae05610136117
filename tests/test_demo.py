"""`datakit demo`'s training part (`train_tiny`): pi05_tiny for the demo's 30 steps from a shard
folder written by datakit convert (the loader fixture: real AV1 -> shards, one camera blank).
Oracle: the run's own metrics.jsonl, read back with the stdlib: the loss falls, and summary.json
is there with the run's first and last loss."""
import json
import math

import pytest

from test_loader_fixtures import shards_rgb  # noqa: F401 - session fixture

from datakit.demo import TRAIN_STEPS, train_tiny


@pytest.mark.timeout(180)
def test_demo_training_loss_falls_and_the_summary_is_written(shards_rgb, tmp_path):  # noqa: F811
    out = tmp_path / "train"
    (out).mkdir()
    (out / "metrics.jsonl").write_text('{"kind": "step", "step": 0, "loss": 99.0}\n')  # a previous demo's run
    train_tiny(shards_rgb, out)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines if x["kind"] == "step"]
    assert len(losses) == TRAIN_STEPS and all(math.isfinite(x) for x in losses)  # a fresh run, not appended
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.85 * first, losses
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps_run"], summary["first_loss"], summary["last_loss"]) == (TRAIN_STEPS, losses[0], losses[-1])

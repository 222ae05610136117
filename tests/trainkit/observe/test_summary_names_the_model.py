"""The run summary names the model a run really has (issue 35, item 7): `pi05 / full` was printed
for a 165k-parameter model (preset `full`, every shape from a tiny checkpoint through
model.init_from). The summary now says the preset whose shape the run has, or the settings on top
of the named one, and the parameter count (the model's own, the oracle).
"""
from __future__ import annotations

import json

from trainkit_fixtures import cli_run, shards_rgb  # noqa: F401 - fixture


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def _row(summary: dict) -> str:
    """The table's model row, as the run printed it (format_summary of summary.json)."""
    from trainkit.observe.summary import format_summary

    return next(x for x in format_summary(summary).splitlines() if x.startswith("model "))


def test_a_tiny_shape_under_the_full_preset_is_named_tiny(shards_rgb, tmp_path, capsys):  # noqa: F811
    from trainkit.models import build_config, build_model

    tiny, full = build_config("pi05", "tiny"), build_config("pi05", "full")
    sets = [f"model.{k}={v}" for k, v in vars(tiny).items() if v != getattr(full, k)]  # full, set to tiny's shape
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}", "train.steps=1",
                        "model.preset=full", *sets, "parallel.fsdp=none")
    assert code == 0, err
    s = _summary(tmp_path / "run")
    params = sum(p.numel() for p in build_model("pi05", "tiny").parameters())
    assert (s["preset"], s["shape_preset"], s["params"]) == ("full", "tiny", params)
    row = _row(s)
    assert "pi05 / tiny (model.preset full, its shape set to tiny's" in row, row
    assert f"{params / 1e3:.2f}k params" in row, row


def test_a_plain_preset_is_named_with_its_count(shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}", "train.steps=1",
                        "parallel.fsdp=none")
    assert code == 0, err
    s = _summary(tmp_path / "run")
    assert (s["preset"], s["shape_preset"], s["model_settings"]) == ("tiny", "tiny", [])
    row = _row(s)
    assert row.split(None, 1)[1].startswith("pi05 / tiny (") and "params" in row, row

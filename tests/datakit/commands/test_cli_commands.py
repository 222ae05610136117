"""The `datakit` entry point reaches every command: doctor, plan and verify on a URL, through `main`
exactly as a user types them (oracles: the commands' own documented exit codes and JSON keys,
and the index read independently with json)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from datakit.cli import main


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("convert", "verify", "info", "doctor", "plan", "demo"):
        assert cmd in out


def test_doctor_and_plan_through_main(converted: Path, tmp_path: Path, capsys):
    # plan: bytes per sample must follow from the index (one frame of every camera, + state/action)
    capsys.readouterr()
    assert main(["plan", str(converted), "--samples-per-s", "100", "--batch-size", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    index = json.loads((converted / "index.json").read_text())
    frame_bytes = sum(c["frame_bytes"] for c in index["cameras"].values())  # every camera has video here
    assert plan["image_bytes_per_sample"] == frame_bytes
    assert plan["read_bytes_per_s_per_rank"] == pytest.approx(100 * plan["bytes_per_sample"])
    # doctor on a folder that is not a dataset: unusable input, exit 2
    assert main(["doctor", str(tmp_path / "nothing-here"), "--no-progress"]) == 2


def test_verify_url(uploaded: str, capsys):
    assert main(["verify", uploaded]) == 0
    assert "OK" in capsys.readouterr().out

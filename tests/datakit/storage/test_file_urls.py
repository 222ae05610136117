"""`datakit verify file://W` and `datakit plan file://W`: a file:// URL is the folder W, as trainkit
reads it: an intact folder verifies and plans, a damaged one is named (before: "missing: not a
converted output folder" for the intact folder, and no damage ever checked through the URL)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from datakit.cli import main


def test_verify_and_plan_read_a_file_url_as_its_folder(converted: Path, tmp_path: Path, capsys):
    folder = Path(shutil.copytree(converted, tmp_path / "w"))
    assert main(["verify", f"file://{folder}"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["plan", f"file://{folder}", "--samples-per-s", "100", "--batch-size", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["plan", str(folder), "--samples-per-s", "100", "--batch-size", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == plan  # the same plan as the plain path's
    shard = sorted(folder.glob("shard-*.tar"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    assert main(["verify", f"file://{folder}"]) != 0
    err = capsys.readouterr()
    assert shard.name in err.out + err.err

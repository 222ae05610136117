"""bench/record.py: the one record header (command, commit, date, machine, card) every GPU bench
script writes (issue 37, item 4). The dry runs of tests/bench/test_bench_gpu_dry_runs.py read it from
their JSON; here the header itself, and that every GPU script calls it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.record import header  # noqa: E402

# the scripts that run on the device: the harness, the *_gpu.py benches, the LeRobot peers' shared loop
GPU_SCRIPTS = sorted({ROOT / "bench" / "gpu" / "gpu.py", ROOT / "bench" / "peers" / "peer_report.py",
                      *ROOT.glob("bench/*/*_gpu.py")})


def test_the_header_says_what_ran_where(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi (nor git): a CPU machine, a copied tree
    h = header(["bench/x.py", "--out", "a b.json"])
    assert h["command"] == "python3 bench/x.py --out 'a b.json'"
    assert h["card"] == "cpu" and h["commit"] is None and h["dirty"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", h["date"]) and h["machine"]["cpus"] >= 1


def test_the_commit_is_the_checkouts():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout (a copied tree): test_the_header_says_what_ran_where holds the None")
    assert header([])["commit"] == head.stdout.strip()


def test_every_gpu_script_writes_the_header():
    assert len(GPU_SCRIPTS) >= 7
    missing = [p.relative_to(ROOT).as_posix() for p in GPU_SCRIPTS
               if not re.search(r"^from bench\.record import header\b", p.read_text(), re.MULTILINE)
               or "header()" not in p.read_text()]
    assert not missing, f"GPU scripts without bench/record.py's header: {missing}"

"""The GPU bench scripts that pending device calls run (bench/results/pending_gpu.md) work end to end
in their tiny CPU dry runs, so a scarce device call does not end on a crash the CPU could have shown
(issue 30's step comparison once did)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = ("command", "commit", "dirty", "date", "machine", "card")  # bench/record.py: every GPU script's JSON


def _run(script: str, out: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--out", str(out), "--cpu", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(HEADER) <= set(doc), f"{script}: no record header ({sorted(set(HEADER) - set(doc))} missing)"
    assert doc["command"].startswith("python3 ") and doc["date"].endswith("UTC"), doc["command"]
    return doc


def test_encode_bench_dry_run_measures_both_parts(tmp_path):
    doc = _run("data/bench_encode_gpu.py", tmp_path / "enc.json", "--parts", "encode", "step", "--iters", "1")
    assert doc["mode"] == "cpu" and {"encode", "step"} <= set(doc)
    step = doc["step"]
    for key in ("step_cache_s", "step_in_loop_s", "encoders_s"):
        assert math.isfinite(step[key]) and step[key] > 0, key
    assert step["ratio_in_loop_over_cache"] > 1  # the encoders cost something in the loop


def test_dreamzero_kernels_dry_run(tmp_path):
    doc = _run("kernels/bench_dreamzero_kernels_gpu.py", tmp_path / "dzk.json")
    assert doc["attention"] and doc["block_14b"]["fwd_bwd_ms"] > 0

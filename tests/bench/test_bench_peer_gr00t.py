"""bench/peers/peer_lerobot_gr00t.py end to end at tiny widths on the CPU, under the LeRobot 0.6.1 oracle
venv (skipped when /tmp/lerobot-venv is not ready): LeRobot's GR00TN17 built from its config, its
default setting (fp32 parameters under bf16 autocast) timed for 3 steps; the record is "ok" with
finite losses, and LeRobot trains exactly the tensors trainkit's tiny preset says (its action head
and the top `lm_trained` LLM layers: counted from trainkit's export of the same shapes, which
tests/trainkit/models/gr00t/test_gr00t_model_oracle.py shows LeRobot loads key for key). Positive controls: an embodiment
slot the tiny model lacks must be recorded as "crash" (not "ok"), and a bad --batch exits 2.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainkit.models import build_model
from trainkit.models.gr00t.weights import export_tensors

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
PEER = ROOT / "bench" / "peers" / "peer_lerobot_gr00t.py"
KEYS = {"name", "status", "samples_per_s", "mfu", "step_time_s", "peak_mem_gib", "losses", "step_times_s", "error"}


def start(out: Path, *extra: str, python: Path = LEROBOT_PY) -> subprocess.Popen:
    return subprocess.Popen([str(python), str(PEER), "--tiny", "--device", "cpu", "--batch", "1", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ""})


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """(exit status, stderr) of a started peer run."""
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def expected_trainable() -> tuple[int, int]:
    """(trainable parameters, of which in the LLM) of the tiny preset, from trainkit's export of it."""
    model = build_model("gr00t", "tiny")
    cfg = model.cfg
    tensors = export_tensors(cfg, model.state_dict(), "isaac")
    top = tuple(f"language_model.layers.{i}." for i in range(cfg.lm_frozen, cfg.lm_depth))
    llm = sum(v.numel() for k, v in tensors.items() if any(t in k for t in top))
    head = sum(v.numel() for k, v in tensors.items() if k.startswith("action_head."))
    return head + llm, llm


@pytest.mark.timeout(300)
@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(), reason=f"no lerobot oracle venv at {LEROBOT_PY.parents[1]}")
def test_peer_lerobot_gr00t_tiny_cpu(tmp_path):
    ok = start(tmp_path / "ok.json", "--steps", "3", "--skip", "1")  # the brief's run, LeRobot's default setting
    bad = start(tmp_path / "bad.json", "--steps", "2", "--skip", "1", "--settings", "fp32", "--embodiment", "4")
    try:
        (rc, err), (bad_rc, bad_err) = finish(ok), finish(bad)
    finally:
        for proc in (ok, bad):
            if proc.poll() is None:
                proc.kill()
    assert rc == 0, err[-3000:]
    doc = json.loads((tmp_path / "ok.json").read_text())
    assert {"peer", "version", "torch", "gpu", "date", "command", "settings"} <= set(doc) and doc["version"] == "0.6.1"
    [rec] = doc["settings"]
    assert KEYS <= set(rec) and rec["name"] == "fp32_autocast" and rec["use_bf16"] and rec["model_params_fp32"]
    assert rec["status"] == "ok", rec["error"]
    assert len(rec["losses"]) == 3 and all(math.isfinite(x) and x > 0 for x in rec["losses"]), rec["losses"]
    assert rec["samples_per_s"] > 0 and rec["mfu"] > 0 and rec["step_time_s"] > 0
    trainable, llm = expected_trainable()
    assert llm > 0 and rec["tune_top_llm_layers"] == 2
    assert (rec["params"], rec["params_backbone_trained"]) == (trainable, llm)
    assert rec["params"] < rec["params_total"]  # the vision tower and the lower LLM layers stay frozen

    assert bad_rc == 0, bad_err[-3000:]  # the positive control: slot 4 of the tiny model's 4 (0..3)
    [rec] = json.loads((tmp_path / "bad.json").read_text())["settings"]
    assert rec["status"] == "crash" and "IndexError" in rec["error"] and rec["samples_per_s"] is None, rec


def test_peer_lerobot_gr00t_bad_batch_exits_2(tmp_path):
    rc, err = finish(start(tmp_path / "x.json", "--batch", "0", python=Path(sys.executable)))
    assert rc == 2 and err.count("\n") == 1 and "--batch" in err, err
    assert not (tmp_path / "x.json").exists()

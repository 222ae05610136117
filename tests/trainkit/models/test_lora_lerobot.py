"""`trainkit export --format peft` of a Pi0.5 LoRA run loads into LeRobot 0.6.1's `PI05Policy` with peft
(`PeftModel.from_pretrained(PI05Policy.from_pretrained(base), adapters)`), LeRobot's own way of
serving a LoRA fine-tune, and gives the velocity of the merged export (`--format lerobot`), which
differs from the base's (the positive control: the adapters do something). The oracle runs in the
lerobot venv (tools/lerobot_oracle/pi05_peft_oracle.py); skipped without that venv or without peft
importable there (`pip install peft`, or PEFT_PATH naming a folder holding it).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import TINY

ROOT = Path(__file__).resolve().parents[3]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "pi05_peft_oracle.py"


def _env() -> dict[str, str]:
    extra = os.environ.get("PEFT_PATH", "")
    return {**os.environ, "PYTHONPATH": extra} if extra else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _peft_in_lerobot_venv() -> bool:
    if not (LEROBOT_PY.parents[1] / ".ready").exists():
        return False
    return subprocess.run([str(LEROBOT_PY), "-c", "import peft"], env=_env(), capture_output=True).returncode == 0


pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not _peft_in_lerobot_venv(), reason="needs the lerobot venv (make lerobot-oracle) "
                                 "with peft importable (pip install peft, or PEFT_PATH)")]


def test_peft_adapters_load_into_lerobots_pi05_policy(shards_rgb, tmp_path):  # noqa: F811
    import torch

    from trainkit.cli import main
    from trainkit.models import family
    from trainkit.models.lora import without_lora
    from trainkit.weights.export import load_run_model
    from trainkit.weights.load import write_weights

    run = tmp_path / "run"
    sets = (f"data.shards={shards_rgb}", f"output.dir={run}", "model.heads_q=8", "model.lora_rank=4",
            "model.lora_alpha=6", "train.steps=3", "optim.lr=3e-2", "output.checkpoint_every=3", "parallel.fsdp=none",
            "parallel.ac_stride={}", "output.progress=false", "data.num_workers=0")
    assert main(["run", str(TINY), *[a for s in sets for a in ("--set", s)]]) == 0
    merged, adapters, base = tmp_path / "merged", tmp_path / "adapters", tmp_path / "base"
    assert main(["export", str(run), str(merged), "--format", "lerobot"]) == 0
    assert main(["export", str(run), str(adapters), "--format", "peft"]) == 0
    model, _, _ = load_run_model(run)  # the base: the run's frozen weights in LeRobot's layout, its config.json
    plain = {k.replace(".base_layer.", "."): v for k, v in model.state_dict().items() if ".lora_" not in k}
    tensors = family("pi05").weights.export_tensors(without_lora(model.cfg), plain, "lerobot")
    shutil.copytree(merged, base)
    (base / "model.safetensors").unlink()
    write_weights(base, {k: v.to(torch.float32, copy=True) for k, v in tensors.items()},
                  json.loads((merged / "config.json").read_text()))
    out = tmp_path / "peft_oracle.npz"
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(out), str(merged), str(base), str(adapters)],
                          capture_output=True, text=True, timeout=200, env=_env())
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    d = dict(np.load(out))
    assert len(d["adapters"]) == 2 * (2 * 2 + 2)  # A and B of: q_proj, v_proj in 2 expert layers; action_in/out_proj
    scale = np.abs(d["merged"]).max()
    assert np.abs(d["peft"] - d["merged"]).max() <= 2e-5 * scale
    assert np.abs(d["base"] - d["merged"]).max() > 1e-3 * scale

"""The export checks its own servability (issue 35, item 2).

LeRobot 0.6.1's `from_pretrained` only warns on a size mismatch and serves a randomly initialised
policy whose actions are finite, so:
- `trainkit export --format lerobot` refuses, in one line naming the first tensor and the setting,
  an export whose tensors differ from the state dict LeRobot builds from the exported config.json
  (trainkit/weights/servable.py; a 4-head Pi0.5), and writes nothing; README.txt of a tiny export
  says LeRobot builds it only patched, and names only files the export has.
- The computed build is LeRobot's own: at full size it equals the state dict `PI05Policy` builds on
  the meta device, key for key and shape for shape (oracle venv; positive control: another image
  size's build differs).
- In the oracle venv, offline: a `pi05_tiny` export served by `PI05Policy.from_pretrained` holds
  every tensor of the file, equal, and nothing else (tools/lerobot_oracle/served_state_oracle.py);
  LeRobot's "loaded" message is not trusted. Positive controls: a folder with one tensor's values
  changed, served and compared with the export's file, fails on that tensor; one whose q_proj
  tensors have 4 heads fails on exactly those (LeRobot warns and keeps them at its random init).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainkit_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import TINY

ROOT = Path(__file__).resolve().parents[1]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE_DIR = ROOT / "tools" / "lerobot_oracle"
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason=f"no lerobot venv at {LEROBOT_PY.parents[1]} (make lerobot-oracle)")
Q_PROJ = "model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"

pytestmark = pytest.mark.timeout(600)


def cli(*args: str) -> int:
    from trainkit.cli import main

    return main(list(args))


def train(shards: Path, out: Path, *sets: str) -> Path:
    base = (f"data.shards={shards}", f"output.dir={out}", "train.steps=2", "output.checkpoint_every=2",
            "parallel.fsdp=none", "parallel.ac_stride={}", "output.progress=false", "data.num_workers=0", *sets)
    assert cli("run", str(TINY), *[a for s in base for a in ("--set", s)]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory, shards_rgb) -> Path:  # noqa: F811
    """A pi05_tiny run as shipped (8 query heads, the tiny tokenizer), exported for LeRobot."""
    root = tmp_path_factory.mktemp("servable")
    run = train(shards_rgb, root / "run")
    assert cli("export", str(run), str(root / "export"), "--format", "lerobot") == 0
    return root / "export"


def test_a_four_head_export_is_refused_by_trainkit_export(shards_rgb, tmp_path, capsys):  # noqa: F811
    run = train(shards_rgb, tmp_path / "run", "model.heads_q=4")
    capsys.readouterr()
    assert cli("export", str(run), str(tmp_path / "out"), "--format", "lerobot") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{Q_PROJ} is [64, 64], LeRobot 0.6.1 builds [128, 64]" in err and "set model.heads_q=8" in err, err
    assert "size-mismatch warning" in err and not (tmp_path / "out").exists()
    assert cli("export", str(run), str(tmp_path / "openpi"), "--format", "openpi") == 0  # openpi builds any heads


def test_the_build_refuses_what_lerobot_would_not_load():
    from trainkit.models import build_model
    from trainkit.models.pi05.lerobot_shapes import lerobot_build
    from trainkit.models.pi05.weights import export_tensors, policy_config
    from trainkit.weights.servable import servable_problem

    with torch.device("meta"):
        model = build_model("pi05", "tiny", {})
    tensors = export_tensors(model.cfg, model.state_dict(), "lerobot")
    policy = policy_config(model.cfg, {"cameras": ["observation.images.top"], "state_dim": 8, "action_dim": 7})
    build = lerobot_build(model.cfg, policy)
    assert servable_problem(tensors, build) is None
    head = "model.paligemma_with_expert.gemma_expert.lm_head.weight"
    wrong = {**tensors, head: torch.empty(257_152, 32, device="meta")}  # another vocabulary than the backbone's
    assert servable_problem(wrong, build).startswith(f"{head} is [257152, 32], LeRobot 0.6.1 builds [1024, 32]")
    del wrong[head]
    assert servable_problem(wrong, build).startswith(f"{head}: LeRobot 0.6.1 builds it [1024, 32]")
    extra = {**tensors, "model.state_proj.weight": torch.empty(2, 2, device="meta")}
    assert servable_problem(extra, build).startswith("model.state_proj.weight is not among")
    resized = dict(policy, image_resolution=[32, 32])  # config.json's image size decides the position table
    assert "position_embedding.weight is [16, 32], LeRobot 0.6.1 builds [64, 32]" in servable_problem(
        tensors, lerobot_build(model.cfg, resized))


def test_the_tiny_export_says_lerobot_needs_the_patch_and_names_only_its_files(tiny_export):
    readme = (tiny_export / "README.txt").read_text()
    assert "LeRobot 0.6.1 builds this model only patched" in readme and "patch_tiny" in readme
    have = {str(p.relative_to(tiny_export)) for p in tiny_export.rglob("*")}
    named = set(re.findall(r"(?<![\w./])([a-z_]+(?:/[a-z_]+)?\.(?:json|safetensors|model))\b", readme))
    named |= {m.rstrip("/") for m in re.findall(r"(?<![\w./])([a-z_]+/)(?=[:\s])", readme)}
    missing = [n for n in named if not any(h == n or h.endswith("/" + n) for h in have)]
    assert len(named) >= 5 and not missing, missing
    assert json.loads((tiny_export / "config.json").read_text())["type"] == "pi05"


def _lerobot(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    return subprocess.run([str(LEROBOT_PY), *args], capture_output=True, text=True, timeout=500, env=env)


@needs_lerobot
def test_the_computed_build_is_lerobots_full_size_state_dict(tmp_path):
    from trainkit.models.pi05.config import full
    from trainkit.models.pi05.lerobot_shapes import lerobot_build

    code = (f"import sys; sys.path.insert(0, {str(ORACLE_DIR)!r}); from pi05_oracle import full_shapes; "
            f"full_shapes({str(tmp_path / 'full_shapes.json')!r})")
    done = _lerobot("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    lerobot = {k: tuple(v) for k, v in json.loads((tmp_path / "full_shapes.json").read_text()).items()}
    policy = json.loads((tmp_path / "full_config" / "config.json").read_text())
    build = lerobot_build(full(), policy)
    assert dict(build.shapes) == lerobot and build.patch_note == ""
    other = lerobot_build(full(), dict(policy, image_resolution=[448, 448]))  # positive control
    assert dict(other.shapes) != lerobot


def _header(folder: Path) -> bytes:
    raw = (folder / "model.safetensors").read_bytes()
    return raw[8:8 + int.from_bytes(raw[:8], "little")]


def _rewrite(folder: Path, change) -> Path:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "trainkit_export.json").unlink()  # a hand-edited folder, no longer the export trainkit sealed
    return folder


@needs_lerobot
def test_lerobot_serves_every_exported_tensor_offline(tiny_export, tmp_path):
    changed = _rewrite(Path(shutil.copytree(tiny_export, tmp_path / "changed")),
                       lambda t: t["model.action_out_proj.bias"].add_(1.0))
    four = "model.paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight"

    narrowed = [k for k in json.loads(_header(tiny_export)) if k == four or
                ("language_model" in k and k.endswith("self_attn.q_proj.weight"))]

    def four_heads(t: dict) -> None:
        for key in narrowed:
            t[key] = t[key][: t[key].shape[0] // 2].clone()

    narrow = _rewrite(Path(shutil.copytree(tiny_export, tmp_path / "four_heads")), four_heads)
    out = tmp_path / "served.json"
    planted = f"{changed},{tiny_export}"  # served: one tensor changed; compared with the export's file
    done = _lerobot(str(ORACLE_DIR / "served_state_oracle.py"), "pi05", str(out), str(tiny_export), planted,
                    str(narrow))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    good = got[str(tiny_export)]
    from safetensors import safe_open

    with safe_open(str(tiny_export / "model.safetensors"), framework="pt") as f:
        n = len(list(f.keys()))
    assert good == {"equal": n, "differ": [], "missing_in_policy": [], "not_from_file": [], "processors": True}, good
    assert got[planted]["differ"] == ["model.action_out_proj.bias"]  # positive control: one value planted
    # 4 heads: LeRobot printed its warning and kept its random init for them, loading the rest
    assert sorted(got[str(narrow)]["differ"]) == sorted(narrowed) and len(narrowed) == 3

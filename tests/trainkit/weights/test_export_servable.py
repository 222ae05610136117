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
from test_tokenizer_source import cli, train  # a tiny run and the CLI, as there
from trainkit_harness import TINY

ROOT = Path(__file__).resolve().parents[3]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE_DIR = ROOT / "tools" / "lerobot_oracle"
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason=f"no lerobot venv at {LEROBOT_PY.parents[1]} (make lerobot-oracle)")
Q_PROJ = "model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"

pytestmark = pytest.mark.timeout(600)


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


# --- GR00T's export: the same check against GrootPolicy's build ----------------------------------------
GR00T_TINY = ROOT / "trainkit" / "configs" / "gr00t_tiny.toml"
GR00T_HEAD = "_groot_model.action_head.action_decoder.layer2.W"


@pytest.fixture(scope="module")
def gr00t_run(tmp_path_factory, shards_rgb) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("gr00t_servable")
    sets = (f"data.shards={shards_rgb}", f"output.dir={root / 'run'}", "train.steps=2", "output.checkpoint_every=2",
            "parallel.fsdp=none", "parallel.ac_stride={}", "output.progress=false", "data.num_workers=0")
    assert cli("run", str(GR00T_TINY), *[a for s in sets for a in ("--set", s)]) == 0
    # GR00T says its tokenizer too (issue 35 item 1): none set, the builtin stand-in
    assert json.loads((root / "run" / "summary.json").read_text())["tokenizer"] == {"name": "builtin", "from": "none set"}
    return root / "run"


@pytest.fixture(scope="module")
def gr00t_export(gr00t_run) -> Path:
    out = gr00t_run.parent / "export"
    assert cli("export", str(gr00t_run), str(out), "--format", "lerobot") == 0
    return out


def test_a_gr00t_export_lerobot_would_not_load_is_refused(gr00t_run, tmp_path, capsys, monkeypatch):
    """Positive control of the check's wiring for GR00T: an n17/config.json whose embodiment count is
    not the tensors' (GrootPolicy would build 5 slots, the file holds 4) is refused, nothing written."""
    import dataclasses

    import trainkit.weights.export
    from trainkit.models import family

    fam = family("gr00t")
    real = fam.weights.lerobot_policy

    def five_slots(cfg, n17, features, out):
        return real(cfg, {**n17, "max_num_embodiments": n17["max_num_embodiments"] + 1}, features, out)

    planted = dataclasses.replace(fam, weights=dataclasses.replace(fam.weights, lerobot_policy=five_slots))
    monkeypatch.setattr(trainkit.weights.export, "family", lambda name: planted if name == "gr00t" else family(name))
    capsys.readouterr()
    assert cli("export", str(gr00t_run), str(tmp_path / "out"), "--format", "lerobot") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the random-init note, one line
    assert err.startswith(f"trainkit: OUT {tmp_path / 'out'}: _groot_model.action_head.state_encoder.layer1.W is "
                          "[4, 16, 24], LeRobot 0.6.1 builds [5, 16, 24]"), err
    assert "model.embodiments (config.json max_num_embodiments)" in err and not (tmp_path / "out").exists(), err


def test_the_gr00t_export_matches_its_build_and_says_lerobot_needs_the_patch(gr00t_export):
    from safetensors import safe_open

    from trainkit.models.gr00t.lerobot_shapes import lerobot_build
    from trainkit.weights.export import load_run_model
    from trainkit.weights.servable import servable_problem

    model, _, _ = load_run_model(gr00t_export.parent / "run")
    build = lerobot_build(model.cfg, json.loads((gr00t_export / "config.json").read_text()),
                          {"n17/config.json": (gr00t_export / "n17" / "config.json").read_bytes()})
    with safe_open(str(gr00t_export / "model.safetensors"), framework="pt") as f:
        tensors = {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}
    assert servable_problem(tensors, build) is None and len(tensors) == len(build.shapes)
    wrong = {**tensors, GR00T_HEAD: torch.empty(3, 24, 16, device="meta")}
    assert servable_problem(wrong, build).startswith(f"{GR00T_HEAD} is [3, 24, 16], LeRobot 0.6.1 builds [4, 24, 16]")
    assert "_cosmos_reason2_qwen3_vl_config" in (gr00t_export / "README.txt").read_text()


@needs_lerobot
def test_the_computed_gr00t_build_is_lerobots_full_size_state_dict(tmp_path):
    """GR00TN17 at N1.7's full size, built by LeRobot on the meta device from trainkit's n17 config.json:
    the computed build is its state dict, less the LM head tied to the embedding (not saved)."""
    from trainkit.models import build_model
    from trainkit.models.gr00t.lerobot_shapes import lerobot_build
    from trainkit.models.gr00t.weights import config_json

    with torch.device("meta"):
        model = build_model("gr00t", "n17")
    (tmp_path / "n17.json").write_text(json.dumps(config_json(model.cfg, {})))
    code = ("import json, sys, torch\n"
            "from lerobot.policies.groot.groot_n1_7 import GR00TN17, GR00TN17Config\n"
            f"cfg = GR00TN17Config(**json.load(open({str(tmp_path / 'n17.json')!r})))\n"
            "with torch.device('meta'):\n    model = GR00TN17(cfg, load_backbone_weights=False)\n"
            f"json.dump({{'_groot_model.' + k: list(v.shape) for k, v in model.state_dict().items()}}, "
            f"open({str(tmp_path / 'shapes.json')!r}, 'w'))\n")
    done = _lerobot("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    lerobot = {k: tuple(v) for k, v in json.loads((tmp_path / "shapes.json").read_text()).items()}
    build = lerobot_build(model.cfg, {}, {"n17/config.json": (tmp_path / "n17.json").read_bytes()})
    tied = "_groot_model.backbone.model.lm_head.weight"
    assert dict(build.shapes) == {k: v for k, v in lerobot.items() if k != tied} and tied in lerobot
    assert build.patch_note == ""
    other = json.loads((tmp_path / "n17.json").read_text())
    other["max_num_embodiments"] = 31  # positive control: another config, another build
    assert dict(lerobot_build(model.cfg, {}, {"n17/config.json": json.dumps(other).encode()}).shapes) != dict(build.shapes)


@needs_lerobot
def test_lerobot_serves_every_exported_gr00t_tensor_offline(gr00t_export, tmp_path):
    from test_gr00t_model_oracle import qwen_config
    from trainkit.weights.export import load_run_model

    model, _, _ = load_run_model(gr00t_export.parent / "run")
    (tmp_path / "qwen.json").write_text(json.dumps(qwen_config(model.cfg)))
    changed = _rewrite(Path(shutil.copytree(gr00t_export, tmp_path / "changed")), lambda t: t[GR00T_HEAD].add_(1.0))
    planted = f"{changed},{gr00t_export}"
    out = tmp_path / "served.json"
    env_qwen = {"QWEN_CONFIG": str(tmp_path / "qwen.json")}
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE_DIR / "served_state_oracle.py"), "groot", str(out),
                           str(gr00t_export), planted], capture_output=True, text=True, timeout=500,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", **env_qwen})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    n = len(json.loads(_header(gr00t_export))) - ("__metadata__" in json.loads(_header(gr00t_export)))
    assert got[str(gr00t_export)] == {"equal": n, "differ": [], "missing_in_policy": [], "not_from_file": [],
                                      "processors": False}, got[str(gr00t_export)]
    assert got[planted]["differ"] == [GR00T_HEAD]  # positive control: one tensor's values planted

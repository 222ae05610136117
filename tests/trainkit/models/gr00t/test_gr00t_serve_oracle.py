"""`trainkit export --format lerobot` of a `gr00t` run is a policy LeRobot 0.6.1 serves (issue 29):
a tiny run (2 steps from an N1.7 checkpoint whose folder holds tokenizer files, so the run's
prompts come from them: `model.init_from`) is exported, and LeRobot in its own venv
(tools/lerobot_oracle/groot_serve_oracle.py; skipped without it) builds `GrootPolicy` and its
processors from the folder alone (the tiny backbone patched in, as groot_model_oracle.py does) and
serves a raw observation: uint8 camera frames as a robot gives them, a state vector, a task string.
The oracle is trainkit's own path for the same observation: the run's loader preset, normaliser and
batch adapter (the chat prompt), its sampler (`sample_actions`: 4 Euler steps from the same
noise), unnormalised with the run's statistics. LeRobot's prompt tokens, normalised state and
embodiment must be trainkit's, its pixels trainkit's views, its action chunk trainkit's to the
model oracle's tolerance, and what its 4 Euler steps add to the noise (the chunk is mostly the noise
unnormalised) trainkit's to 1e-5 relative. Positive control: trainkit's chunk for a wrongly
normalised state moves the noise otherwise.

The views go through N1.7's transform on both sides (the tiny preset's `view_transform` "n17":
bicubic to 16, centre crop 14, bicubic back): LeRobot's with torchvision's float kernel (its GPU
path) must give trainkit's pixels to float32 rounding, with its CPU fixed-point kernel within half a
level on average. Positive control: the same export with its VLM step told to crop nothing (as the
export wrote it before the transform was wired) gives other pixels.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from test_gr00t_model_oracle import hf_pixel_values, qwen_config
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.models import family

ROOT = Path(__file__).resolve().parents[4]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "groot_serve_oracle.py"
TINY = ROOT / "trainkit" / "configs" / "gr00t_tiny.toml"
TOL = 1e-5  # tests/trainkit/models/gr00t/test_gr00t_model_oracle.py's, on the velocity
FLOW_TOL = 1e-5  # on what the sampler's steps add to the noise (measured 8.8e-7 relative, torch 2.13 CPU)

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(
    not (LEROBOT_PY.parents[1] / ".ready").exists(), reason=f"no lerobot oracle venv at {LEROBOT_PY.parents[1]}")]


def start_checkpoint(folder: Path) -> Path:
    """An Isaac-GR00T N1.7 checkpoint of the tiny shape, its weights away from the init's (N(0, 0.02)
    matrices give a velocity too small to tell a wrong input from a right one), with the tokenizer
    files of the builtin stand-in beside them (a Qwen3-VL tokenizer folder's layout)."""
    from trainkit.models import build_model
    from trainkit.models.gr00t.lerobot_policy import processor_folder
    from trainkit.models.gr00t.weights import config_json, export_tensors
    from trainkit.weights.load import write_weights

    torch.manual_seed(0)
    model = build_model("gr00t", "tiny")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tensors = {k: v.detach().clone() for k, v in export_tensors(model.cfg, model.state_dict(), "isaac").items()}
    write_weights(folder, tensors, config_json(model.cfg, {}), processor_folder(model.cfg))
    return folder


def train_and_export(shards: Path, root: Path) -> tuple[Path, Path]:
    from trainkit.cli import main

    run, out = root / "run", root / "export"
    sets = (f"data.shards={shards}", f"output.dir={run}", "train.steps=2", "output.checkpoint_every=2",
            "parallel.fsdp=none", "parallel.ac_stride={}", "data.num_workers=0",
            f"model.init_from={start_checkpoint(root / 'start')}")
    assert main(["run", str(TINY), *[a for s in sets for a in ("--set", s)]]) == 0
    assert main(["export", str(run), str(out), "--format", "lerobot"]) == 0
    return run, out


def trainkit_serves(run: Path, frames: dict[str, torch.Tensor], state: torch.Tensor, task: int,
                    noise: torch.Tensor) -> tuple[torch.Tensor, object, tuple[torch.Tensor, torch.Tensor]]:
    """trainkit's normalised action chunk (1, horizon, A) for the observation, the model batch it
    sampled from, and the action normalisation (scale, bias) of the run's statistics."""
    from datakit.loader import Normaliser
    from trainkit.data import loader_settings, read_run_shards
    from trainkit.models.gr00t.model import sample_actions
    from trainkit.weights.export import load_run_model

    model, cfg, _ = load_run_model(run)
    model.eval()
    fam = family("gr00t")
    shards = read_run_shards(cfg.data, fam.max_slots(model.cfg))
    index = shards.index
    loader = fam.loader_config(model.cfg, index, **loader_settings(
        cfg.data, shards.slots, seed=0, rank=0, world_size=1, micro_batch=1, image_dtype=torch.float32,
        pin_memory=False))
    a = len(index.action_names)
    hb = {"images": torch.stack([frames[cam] for cam in shards.slots])[None, :, None],
          "image_mask": torch.ones((1, len(shards.slots)), dtype=torch.bool), "state": state[None, None],
          "task_index": torch.tensor([task]), "action": torch.zeros((1, model.cfg.horizon, a)),
          "action_is_pad": torch.zeros((1, model.cfg.horizon), dtype=torch.bool), "row": torch.tensor([0])}
    normaliser = Normaliser.from_index(index, loader)
    adapter = fam.batches(model.cfg, index, normaliser)
    hb = adapter.extras(hb, torch.Generator().manual_seed(0))
    batch = adapter.model_batch({**hb, **normaliser(hb)})
    x = sample_actions(model, batch, noise)[..., :a]
    return x, batch, normaliser.action_affine


@pytest.fixture(scope="module")
def served(tmp_path_factory, shards_rgb):  # noqa: F811
    from datakit.shards.index import load_index
    from trainkit.models import build_model

    root = tmp_path_factory.mktemp("gr00t_serve")
    run, export = train_and_export(shards_rgb, root)
    index = load_index(shards_rgb)
    cfg = build_model("gr00t", "tiny").cfg
    gen = torch.Generator().manual_seed(7)
    frames = {cam: torch.randint(0, 256, (cfg.image_height, cfg.image_width, 3), dtype=torch.uint8, generator=gen)
              for cam in index.cameras}
    lo, hi = torch.tensor(index.stats["state"]["min"]), torch.tensor(index.stats["state"]["max"])
    state = (lo + (hi - lo) * torch.rand(lo.shape, generator=gen)).float()
    noise = torch.randn((1, cfg.horizon, cfg.action_dim), generator=gen)
    doc = {"export": str(export), "qwen": qwen_config(cfg), "images": frames, "state": state,
           "task": index.tasks[0], "noise": noise, "kernel": "float", "control": str(uncropped(export, root / "control"))}
    torch.save(doc, root / "in.pt")
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(root / "in.pt"), str(root / "out.pt")],
                          capture_output=True, text=True, timeout=280, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    # LeRobot's prepare_observation_for_inference makes a frame x / 255 and its pack step turns it
    # back into uint8 by (x * 255) truncated, which loses a level at some values: trainkit gets the
    # frames LeRobot's model sees
    seen = {cam: ((f.float() / 255).clamp(0, 1) * 255.0).to(torch.uint8) for cam, f in frames.items()}
    return torch.load(root / "out.pt", weights_only=False), run, seen, state, noise


def vlm_step(folder: Path) -> dict:
    """The export's `groot_n1_7_vlm_encode_v1` settings (policy_preprocessor.json)."""
    steps = json.loads((folder / "policy_preprocessor.json").read_text())["steps"]
    return next(s["config"] for s in steps if s["registry_name"] == "groot_n1_7_vlm_encode_v1")


def uncropped(export: Path, control: Path) -> Path:
    """A copy of the export whose VLM step crops nothing (image_crop_size and crop_fraction None)."""
    shutil.copytree(export, control)
    doc = json.loads((control / "policy_preprocessor.json").read_text())
    for step in doc["steps"]:
        if step["registry_name"] == "groot_n1_7_vlm_encode_v1":
            step["config"].update(image_crop_size=None, crop_fraction=None)
    (control / "policy_preprocessor.json").write_text(json.dumps(doc, indent=2))
    return control


def flow(out: dict, noise: torch.Tensor, affine: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """LeRobot's action chunk normalised back with the run's statistics, less the noise it started
    from: what the 4 Euler steps of the velocity added (the chunk itself is mostly the noise)."""
    scale, bias = affine
    return out["actions"] * scale + bias - noise[..., :scale.shape[0]]


def test_lerobot_serves_the_gr00t_export_as_trainkit_acts(served):
    out, run, frames, state, noise = served
    ours, batch, affine = trainkit_serves(run, frames, state, 0, noise)
    assert torch.equal(out["input_ids"], batch.tokens) and torch.equal(out["attention_mask"].bool(), batch.token_mask)
    torch.testing.assert_close(out["state"][:, 0], batch.state, rtol=1e-6, atol=1e-6)
    assert out["embodiment_id"].tolist() == [1]  # the tiny model's embodiment slot
    cfg = family("gr00t").presets["tiny"]()
    pixels = hf_pixel_values(batch.images.flatten(0, 1), cfg)
    torch.testing.assert_close(out["pixel_values"], pixels, rtol=0, atol=1e-6)
    level = 2.0 / 255.0  # one uint8 level in [-1, 1]
    assert ((out["pixel_values_native"] - pixels).abs() / level).mean() < 0.5  # LeRobot's CPU kernel
    scale, bias = affine
    assert out["actions"].shape == ours.shape and torch.isfinite(out["actions"]).all()
    torch.testing.assert_close(out["actions"], (ours - bias) / scale, rtol=TOL, atol=TOL)
    moved = ours - noise[..., :ours.shape[-1]]
    err = float((flow(out, noise, affine) - moved).abs().max() / moved.abs().max())
    assert err < FLOW_TOL, err


def test_the_export_crops_as_trainkit_and_an_uncropped_one_fails(served):
    """The export's VLM step crops the centre 14 of 16 (N1.7's 230 / 256) as trainkit's loader does;
    the same export told to crop nothing gives pixels many levels away from trainkit's views."""
    out, run, frames, state, noise = served
    _, batch, _ = trainkit_serves(run, frames, state, 0, noise)
    export = run.parent / "export"
    assert (vlm_step(export)["image_crop_size"], vlm_step(export)["crop_fraction"]) == ([14, 14], 230 / 256)
    pixels = hf_pixel_values(batch.images.flatten(0, 1), family("gr00t").presets["tiny"]())
    assert float((out["control_pixel_values"] - pixels).abs().max()) > 10 * 2.0 / 255.0


def test_a_wrong_state_normalisation_fails_the_comparison(served):
    """The state mirrored in the data's range: what q01 and q99 swapped in the export's statistics
    would make of it. (A wrong prompt, camera order or embodiment fails the exact comparisons above.)"""
    from datakit.shards.index import load_index
    from trainkit.weights.export import load_run_model

    out, run, frames, state, noise = served
    stats = load_index(Path(load_run_model(run)[1].data.shards)).stats["state"]
    mirrored = torch.tensor(stats["q01"]) + torch.tensor(stats["q99"]) - state
    other, _, affine = trainkit_serves(run, frames, mirrored.float(), 0, noise)
    moved = other - noise[..., :other.shape[-1]]
    err = float((flow(out, noise, affine) - moved).abs().max() / moved.abs().max())
    assert err > 10 * FLOW_TOL, err

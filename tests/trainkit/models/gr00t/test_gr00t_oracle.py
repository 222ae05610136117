"""The `gr00t` action head against LeRobot 0.6.1's GR00T N1.7 head (`GR00TN17ActionHead`: LayerNorm,
VL self-attention, `AlternateVLDiT`, per-embodiment encoders and decoder), built at tiny widths in
its own venv (tools/lerobot_oracle/groot_head_oracle.py; skipped when /tmp/lerobot-venv is not ready).

Given the same backbone features (images inline between text, text padding at the end: trainkit
gathers text and image tokens apart, LeRobot masks the whole sequence) and masks,
weights (written to LeRobot's names by trainkit's own export mapping, weights.py: the trained
embodiment's slice among random other slots), state, actions, noise, flow time and state-dropout
draw, in training mode (dropout 0: LeRobot's blocks draw their masks from its own RNG), the two
heads give the same loss (relative 1e-6), velocity and gradients (every head parameter and the
backbone features). Positive controls, each must fail the same comparison: the text and image
masks swapped, the VL self-attention skipped, the slice written to another embodiment's slot.
"""
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trainkit.models import build_model
from trainkit.models.gr00t import Gr00tBatch, sample_flow
from trainkit.models.gr00t.weights import export_tensors, head_rules, n17_config

ROOT = Path(__file__).resolve().parents[4]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "groot_head_oracle.py"
TOL = dict(rtol=1e-5, atol=1e-5)  # velocity and the features' gradient (measured: 1.2e-6 at most)
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)  # parameter gradients: sums over batch and tokens in another order


def lerobot_head_state(cfg, params, base):
    """trainkit's head tensors under LeRobot's `GR00TN17ActionHead` names (the export's mapping)."""
    out = export_tensors(cfg, params, "isaac", base)
    return {k.removeprefix("action_head."): v.detach().contiguous() for k, v in out.items()
            if k.startswith("action_head.")}


@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(), reason=f"no lerobot oracle venv at {LEROBOT_PY.parents[1]}")
def test_action_head_equals_lerobot_n17_head(tmp_path):
    torch.manual_seed(0)
    model = build_model("gr00t", "tiny").train()
    cfg = model.cfg
    head = {r.target for r in head_rules(cfg)}
    with torch.no_grad():  # non-trivial values everywhere (init has zero biases and unit norms)
        for n, p in model.named_parameters():
            if n in head:
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.2)
                        + (1.0 if n.endswith(("norm.weight", "norm1.weight", "norm3.weight")) else 0.0))
    params = dict(model.named_parameters())
    slots = {r.sources[0]: torch.randn(cfg.embodiments, *params[r.target].shape) * 0.2
             for r in head_rules(cfg) if r.op == "slice"}  # the other embodiments' slots: random
    b, n_img = 3, cfg.tokens_per_image
    # [2 text; camera 1; 2 text; camera 2; 4 text], the last text padded per sample
    kinds = [0] * 2 + [1] * n_img + [0] * 2 + [1] * n_img + [0] * 4
    image_mask = torch.tensor(kinds, dtype=torch.bool)[None].expand(b, -1).clone()
    keep = torch.ones(b, len(kinds), dtype=torch.bool)
    keep[1, -2:] = False
    keep[2, -4:] = False
    features = torch.randn(b, len(kinds), cfg.lm_width)
    actions = torch.randn(b, cfg.horizon, cfg.action_dim)
    noise, time = sample_flow(actions, torch.Generator().manual_seed(3))
    time[0], time[2] = 0.0, 0.998  # the ends of GR00T's range
    state_u = torch.tensor([0.5, 0.1, 0.9])  # sample 1's state dropped (< 0.2)
    action_mask = torch.zeros_like(actions, dtype=torch.bool)
    action_mask[:, :, :7] = True  # 7 real action channels, the rest padding
    action_mask[2, -1] = False  # a padded step at the episode's end
    state = torch.randn(b, cfg.state_dim)
    batch = Gr00tBatch(images=torch.zeros(b, 2, 3, 1, 1), image_mask=torch.ones(b, 2, dtype=torch.bool),
                       tokens=torch.zeros(b, 1, dtype=torch.long), token_mask=torch.ones(b, 1, dtype=torch.bool),
                       state=state, actions=actions, action_mask=action_mask, noise=noise, time=time,
                       state_drop=state_u < cfg.state_dropout)

    def loss_of(pred, target):
        w = action_mask.float()
        return ((pred - target).square() * w).sum() / (w.sum() + 1e-6)

    x = features.clone().requires_grad_(True)
    pred, target = model.action_head(x, image_mask, keep, None, 2 * n_img, batch)
    loss = loss_of(pred, target)
    loss.backward()
    with torch.no_grad():
        swapped = model.action_head(features, ~image_mask, keep, None, len(kinds) - 2 * n_img, batch)[0]
        blocks, model.vl_blocks = model.vl_blocks, torch.nn.ModuleList()
        no_vl = model.action_head(features, image_mask, keep, None, 2 * n_img, batch)[0]
        model.vl_blocks = blocks

    doc = {"config": {**n17_config(cfg), "tune_projector": True, "tune_diffusion_model": True, "tune_vlln": True},
           "inputs": {"backbone_features": features, "image_mask": image_mask, "backbone_attention_mask": keep,
                      "state": state[:, None], "action": actions, "action_mask": action_mask.float(), "noise": noise,
                      "t": time, "state_u": state_u, "embodiment": cfg.embodiment},
           "weights": {"right": lerobot_head_state(cfg, params, slots),
                       "wrong_slot": lerobot_head_state(replace(cfg, embodiment=cfg.embodiment + 1), params, slots)}}
    torch.save(doc, tmp_path / "in.pt")
    subprocess.run([str(LEROBOT_PY), str(ORACLE), str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], check=True,
                   timeout=300, env={**os.environ, "PYTHONPATH": ""})
    out = torch.load(tmp_path / "out.pt", weights_only=False)

    right = out["right"]
    assert abs(right["loss"].item() - loss.item()) <= 1e-6 * abs(loss.item()), (right["loss"], loss)
    torch.testing.assert_close(right["pred"], pred.detach(), **TOL)
    torch.testing.assert_close(right["features_grad"], x.grad, **TOL)
    # every head parameter's gradient: the trained slice of the per-embodiment ones, and the other
    # slots get none in LeRobot either (zeros)
    theirs = right["grads"]
    for rule in head_rules(cfg):
        got = rule.gather([theirs[s.removeprefix("action_head.")] for s in rule.sources])
        torch.testing.assert_close(got, params[rule.target].grad, **GRAD_TOL, msg=lambda m: f"{rule.target}: {m}")
        if rule.op == "slice":
            others = theirs[rule.sources[0].removeprefix("action_head.")].clone()
            others[cfg.embodiment] = 0
            assert not others.any(), rule.sources[0]
    assert len(theirs) == len(head_rules(cfg)) - sum(r.op == "cat" for r in head_rules(cfg)) + sum(
        len(r.sources) for r in head_rules(cfg) if r.op == "cat")
    # the positive controls are caught by the same comparison
    for name, wrong in (("masks swapped", swapped), ("VL self-attention skipped", no_vl),
                        ("another embodiment's slot", out["wrong_slot"]["pred"])):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(right["pred"], wrong, **TOL, msg=name)

"""The `gr00t` action head against LeRobot 0.6.1's GR00T head (`GR00TN17ActionHead` with
`AlternateVLDiT`, N1.6's head; `vl_self_attention` off, state dropout 0), built at tiny widths in
its own venv (tools/lerobot_oracle/groot_head_oracle.py; skipped when /tmp/lerobot-venv is absent).

Given the same backbone features and masks, weights (mapped to LeRobot's names and layouts:
category-specific linears hold W as (in, out)), state, actions, noise and flow time, the two heads
give the same velocity, loss and gradients (every head parameter and the backbone features) to
float32 precision. A deliberately wrong mapping (K and V of the first, text-attending block
swapped) is run through the same comparison and must fail it, so the test can fail.
"""
import os
import subprocess
from pathlib import Path

import pytest
import torch

from trainkit.models import build_model
from trainkit.models.gr00t import Gr00tBatch, sample_flow

ROOT = Path(__file__).resolve().parents[1]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "groot_head_oracle.py"
TOL = dict(rtol=1e-4, atol=1e-5)


def to_lerobot(t: dict[str, torch.Tensor], depth: int, *, swap_kv: bool = False) -> dict[str, torch.Tensor]:
    """trainkit's head tensors (parameters or their gradients, by trainkit name) under LeRobot's names."""
    out = {"vlln.weight": t["vl_norm.weight"], "vlln.bias": t["vl_norm.bias"],
           "position_embedding.weight": t["action_pos.weight"]}
    for ours, theirs in (("state_encoder.fc1", "state_encoder.layer1"), ("state_encoder.fc2", "state_encoder.layer2"),
                         ("action_encoder.w1", "action_encoder.W1"), ("action_encoder.w2", "action_encoder.W2"),
                         ("action_encoder.w3", "action_encoder.W3"), ("action_decoder.fc1", "action_decoder.layer1"),
                         ("action_decoder.fc2", "action_decoder.layer2")):
        out[f"{theirs}.W"] = t[f"{ours}.weight"].T[None]  # CategorySpecificLinear: (embodiments, in, out)
        out[f"{theirs}.b"] = t[f"{ours}.bias"][None]
    dit = {"timestep_encoder.timestep_embedder.linear_1": "time_embed.fc1",
           "timestep_encoder.timestep_embedder.linear_2": "time_embed.fc2",
           "proj_out_1": "dit_out.ada", "proj_out_2": "dit_out.proj"}
    for i in range(depth):
        b, ours = f"transformer_blocks.{i}", f"dit_blocks.{i}"
        dit.update({f"{b}.norm1.linear": f"{ours}.ada", f"{b}.attn1.to_out.0": f"{ours}.out",
                    f"{b}.ff.net.0.proj": f"{ours}.ff_in", f"{b}.ff.net.2": f"{ours}.ff_out"})
        for kind in ("weight", "bias"):
            if f"{ours}.qkv.{kind}" in t:  # self-attention block: fused q, k, v
                q, k, v = t[f"{ours}.qkv.{kind}"].chunk(3, dim=0)
            else:
                q, (k, v) = t[f"{ours}.q.{kind}"], t[f"{ours}.kv.{kind}"].chunk(2, dim=0)
                if swap_kv and i == 0:
                    k, v = v, k
            out.update({f"model.{b}.attn1.to_q.{kind}": q, f"model.{b}.attn1.to_k.{kind}": k,
                        f"model.{b}.attn1.to_v.{kind}": v})
    for theirs, ours in dit.items():
        for kind in ("weight", "bias"):
            out[f"model.{theirs}.{kind}"] = t[f"{ours}.{kind}"]
    return {k: v.detach().contiguous() for k, v in out.items()}


def lerobot_config(cfg) -> dict:
    return dict(backbone_embedding_dim=cfg.lm_width, max_state_dim=cfg.state_dim, max_action_dim=cfg.action_dim,
                action_horizon=cfg.horizon, hidden_size=cfg.head_hidden, input_embedding_dim=cfg.dit_width,
                state_history_length=1, add_pos_embed=True, max_seq_len=cfg.max_positions, use_vlln=True,
                use_alternate_vl_dit=True, attend_text_every_n_blocks=2, state_dropout_prob=0.0, max_num_embodiments=1,
                noise_s=0.999, num_timestep_buckets=cfg.time_buckets, tune_projector=True, tune_diffusion_model=True,
                tune_vlln=True, vl_self_attention_cfg={"num_layers": 0},
                diffusion_model_cfg=dict(positional_embeddings=None, num_layers=cfg.dit_depth,
                                         num_attention_heads=cfg.dit_heads,
                                         attention_head_dim=cfg.dit_width // cfg.dit_heads, norm_type="ada_norm",
                                         dropout=0.0, final_dropout=True, output_dim=cfg.head_hidden,
                                         interleave_self_attention=True))


@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(), reason=f"no lerobot oracle venv at {LEROBOT_PY.parents[1]}")
def test_action_head_equals_lerobot_groot_head(tmp_path):
    torch.manual_seed(0)
    model = build_model("gr00t", "tiny")
    cfg = model.cfg
    head = [n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("lm_layers")]
    with torch.no_grad():  # non-trivial values everywhere (init has zero biases and unit norms)
        for n, p in model.named_parameters():
            if n in head:
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.2) + (1.0 if n == "vl_norm.weight" else 0.0))
    b, n_img, n_txt = 3, 2 * cfg.tokens_per_image, 6
    features = torch.randn(b, n_img + n_txt, cfg.lm_width)
    image_keep = torch.ones(b, n_img, dtype=torch.bool)
    image_keep[1, cfg.tokens_per_image:] = False  # sample 1 has no second camera
    text_keep = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)
    actions = torch.randn(b, cfg.horizon, cfg.action_dim)
    noise, time = sample_flow(actions, torch.Generator().manual_seed(3))
    time[0] = 0.0  # the ends of GR00T's range
    time[2] = 0.998
    action_mask = torch.zeros_like(actions, dtype=torch.bool)
    action_mask[:, :, :7] = True  # 7 real action channels, the rest padding
    action_mask[2, -1] = False  # a padded step at the episode's end
    state = torch.randn(b, cfg.state_dim)
    batch = Gr00tBatch(images=torch.zeros(b, 2, 3, 1, 1), image_mask=torch.ones(b, 2, dtype=torch.bool),
                       tokens=torch.zeros(b, n_txt, dtype=torch.long), token_mask=text_keep, state=state,
                       actions=actions, action_mask=action_mask, noise=noise, time=time)
    x = features.clone().requires_grad_(True)
    pred, target = model.action_head(x, image_keep, text_keep, batch)
    w = action_mask.float()
    loss = ((pred - target).square() * w).sum() / (w.sum() + 1e-6)
    loss.backward()

    params = dict(model.named_parameters())
    doc = {"config": lerobot_config(cfg),
           "inputs": {"backbone_features": features, "image_mask": torch.cat([torch.ones(b, n_img, dtype=torch.bool),
                                                                            torch.zeros(b, n_txt, dtype=torch.bool)], 1),
                      "backbone_attention_mask": torch.cat([image_keep, text_keep], 1), "state": state[:, None],
                      "action": actions, "action_mask": action_mask.float(), "noise": noise, "t": time},
           "weights": {"right": to_lerobot(params, cfg.dit_depth),
                       "wrong": to_lerobot(params, cfg.dit_depth, swap_kv=True)}}
    torch.save(doc, tmp_path / "in.pt")
    subprocess.run([str(LEROBOT_PY), str(ORACLE), str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], check=True,
                   timeout=300, env={**os.environ, "PYTHONPATH": ""})
    out = torch.load(tmp_path / "out.pt", weights_only=False)

    right = out["right"]
    torch.testing.assert_close(right["pred"], pred.detach(), **TOL)
    torch.testing.assert_close(right["loss"], loss.detach(), **TOL)
    torch.testing.assert_close(right["features_grad"], x.grad, **TOL)
    grads = to_lerobot({n: p.grad for n, p in params.items() if p.grad is not None}, cfg.dit_depth)
    assert set(right["grads"]) == set(grads)  # every head parameter receives a gradient on both sides
    for name, g in grads.items():
        torch.testing.assert_close(right["grads"][name], g, **TOL, msg=lambda m: f"{name}: {m}")
    # the wrong mapping is caught by the same comparison
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out["wrong"]["pred"], pred.detach(), **TOL)

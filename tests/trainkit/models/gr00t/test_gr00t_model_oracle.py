"""The whole `gr00t` model (Qwen3-VL backbone, frozen and trained LLM layers, N1.7 head) against
LeRobot 0.6.1's `GR00TN17` at tiny widths, through trainkit's export (tools/lerobot_oracle/
groot_model_oracle.py; skipped when /tmp/lerobot-venv is not ready):

- export round trip: the tensors trainkit's export writes (Isaac-GR00T's layout and config.json)
  load into LeRobot's `GR00TN17` by its own `from_pretrained` with no key missing but the two it
  never reads (final norm, tied LM head) and none unexpected, and come back equal: the trained
  embodiment's slice in place, the other 3 slots the start checkpoint's;
- end to end, on the same views, prompt tokens, state, actions, noise, time and state-dropout draw,
  in training mode (dropout 0, state dropout 0.2, the top 2 LLM layers trained on both sides): the
  backbone features, the velocity, the loss (relative 1e-6) and the gradient of every trainable
  tensor (head and LLM layers) are equal. The positive controls live with each part: masks swapped,
  VL self-attention skipped, another embodiment (tests/trainkit/models/gr00t/test_gr00t_oracle.py), wrong mRoPE section,
  deepstack off (tests/trainkit/models/gr00t/test_gr00t_backbone_oracle.py), the frozen / trained split shifted
  (tests/trainkit/models/gr00t/test_gr00t_backbone_split.py).
"""
import os
import subprocess
from pathlib import Path

import pytest
import torch

from test_gr00t import tiny_batch
from trainkit.models import build_model
from trainkit.models.gr00t.weights import backbone_name, config_json, export_tensors, head_rules
from trainkit.models.gr00t.qwen3_vl.backbone import BACKBONE_PREFIX
from trainkit.weights.load import write_weights

ROOT = Path(__file__).resolve().parents[4]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "groot_model_oracle.py"
TOL = dict(rtol=1e-5, atol=1e-5)  # features and velocity
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)  # parameter gradients: sums over batch and tokens in another order
NOT_READ = {"backbone.model.lm_head.weight", BACKBONE_PREFIX + "language_model.norm.weight"}


def qwen_config(cfg) -> dict:
    """The tiny model's backbone as a transformers Qwen3-VL config (what LeRobot builds it from)."""
    return {"image_token_id": cfg.image_token_id, "video_token_id": cfg.vocab - 1,
            "vision_start_token_id": cfg.vision_start_id, "vision_end_token_id": cfg.vision_end_id,
            "tie_word_embeddings": True,
            "text_config": {"attention_bias": False, "head_dim": cfg.head_dim, "hidden_act": "silu",
                            "hidden_size": cfg.lm_width, "intermediate_size": cfg.lm_mlp, "max_position_embeddings": 4096,
                            "num_attention_heads": cfg.heads_q, "num_hidden_layers": cfg.lm_depth,
                            "num_key_value_heads": cfg.heads_kv, "rms_norm_eps": cfg.rms_eps,
                            "rope_scaling": {"mrope_interleaved": True, "mrope_section": list(cfg.mrope_section),
                                             "rope_type": "default"},
                            "rope_theta": cfg.rope_theta, "vocab_size": cfg.vocab},
            "vision_config": {"deepstack_visual_indexes": list(cfg.deepstack), "depth": cfg.vision_depth,
                              "hidden_act": "gelu_pytorch_tanh", "hidden_size": cfg.vision_width, "in_channels": 3,
                              "intermediate_size": cfg.vision_mlp, "num_heads": cfg.vision_heads,
                              "num_position_embeddings": cfg.position_table, "out_hidden_size": cfg.lm_width,
                              "patch_size": cfg.patch, "spatial_merge_size": cfg.merge,
                              "temporal_patch_size": cfg.temporal_patch}}


def hf_pixel_values(images: torch.Tensor, cfg) -> torch.Tensor:
    """(N, 3, H, W) views -> transformers' Qwen3-VL `pixel_values`: each view repeated temporal_patch
    times, patches in merge x merge block order (the image processor's layout)."""
    n, c, h, w = images.shape
    p, m, tp = cfg.patch, cfg.merge, cfg.temporal_patch
    gh, gw = h // p, w // p
    x = images[:, None].expand(n, tp, c, h, w).reshape(n, 1, tp, c, gh // m, m, p, gw // m, m, p)
    return x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9).reshape(n * gh * gw, c * tp * p * p)


def run_oracle(tmp: Path, name: str, tensors: dict, cfg, inputs: dict, extra: dict) -> dict:
    folder = tmp / name
    folder.mkdir()
    write_weights(folder, tensors, config_json(cfg, {}))
    doc = {"folder": str(folder), "qwen": qwen_config(cfg), "tune_top_llm_layers": cfg.lm_trained, "inputs": inputs,
           **extra}
    torch.save(doc, tmp / f"{name}.in.pt")
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(tmp / f"{name}.in.pt"), str(tmp / f"{name}.out.pt")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp / f"{name}.out.pt", weights_only=False)


@pytest.mark.timeout(600)
@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(), reason=f"no lerobot oracle venv at {LEROBOT_PY.parents[1]}")
def test_model_and_export_equal_lerobot_gr00t_n17(tmp_path):
    torch.manual_seed(0)
    model = build_model("gr00t", "tiny").train()
    cfg = model.cfg
    with torch.no_grad():  # away from the init's unit norms and zero biases
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    params = dict(model.named_parameters())
    base = {r.sources[0]: torch.randn(cfg.embodiments, *params[r.target].shape) * 0.2
            for r in head_rules(cfg) if r.op == "slice"}  # the start checkpoint's other embodiments
    tensors = {k: v.detach().clone() for k, v in export_tensors(cfg, model.state_dict(), "isaac", base).items()}

    batch = tiny_batch(cfg)
    batch.image_mask[:] = True  # LeRobot has no missing camera
    state_u = torch.tensor([0.5, 0.1, 0.9])
    batch.state_drop = state_u < cfg.state_dropout
    features = model.vl_features(batch)[0]
    pred, target = model.action_head(*model.conditioning(batch), batch)
    w = batch.action_mask.float()
    loss = ((pred - target).square() * w).sum() / (w.sum() + 1e-6)
    loss.backward()

    input_ids, valid, _ = model.vl_inputs(batch)
    n = batch.images.shape[0] * batch.images.shape[1]
    inputs = {"input_ids": input_ids, "attention_mask": valid.long(),
              "pixel_values": hf_pixel_values(batch.images.flatten(0, 1), cfg),
              "image_grid_thw": torch.tensor([[1, cfg.image_height // cfg.patch, cfg.image_width // cfg.patch]] * n),
              "state": batch.state[:, None], "action": batch.actions, "action_mask": w,
              "embodiment_id": torch.full((batch.state.shape[0],), cfg.embodiment)}
    draws = {"noise": batch.noise, "t": batch.time, "state_u": state_u}
    out = run_oracle(tmp_path, "export", tensors, cfg, inputs, draws)

    # the export round trip
    assert out["unexpected"] == [] and set(out["missing"]) <= NOT_READ, (out["missing"], out["unexpected"])
    assert set(out["state"]) - NOT_READ == set(tensors)
    for key, t in tensors.items():
        assert torch.equal(out["state"][key], t), key
    for key, full in base.items():
        others = [e for e in range(cfg.embodiments) if e != cfg.embodiment]
        assert torch.equal(out["state"][key][others], full[others]), key

    # end to end
    torch.testing.assert_close(out["features"], features.detach(), **TOL)
    torch.testing.assert_close(out["pred"], pred.detach(), **TOL)
    assert abs(out["loss"].item() - loss.item()) <= 1e-6 * abs(loss.item()), (out["loss"], loss)
    head = {r.target: r for r in head_rules(cfg)}
    trained = {n: p for n, p in params.items() if p.requires_grad}
    assert len(out["grads"]) == sum(len(head[n].sources) if n in head else 1 for n in trained)
    for n, p in trained.items():
        if n in head:
            got = head[n].gather([out["grads"][s] for s in head[n].sources])
        else:
            got = out["grads"][BACKBONE_PREFIX + backbone_name(n, cfg)]
        torch.testing.assert_close(got, p.grad, **GRAD_TOL, msg=lambda m: f"{n}: {m}")

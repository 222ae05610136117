"""Level 1: the `dreamzero` DiT run as plain Wan (no action/state tokens, one time per sample, dense
attention: `DreamZero.wan`) equals diffusers 0.42.1's `WanTransformer3DModel` built at tiny widths from
a config (I2V: image K/V, first-frame channels concatenated), its weights trainkit's converted by
diffusers' own `convert_wan_transformer_to_diffusers` (tools/diffusers_oracle/wan_oracle.py, run in
the oracle venv; skipped when /tmp/lerobot-venv is absent): output, the weighted per-frame loss and
every parameter's gradient, float32 on the CPU.

Positive controls, run here on the same weights and inputs and compared with the same oracle
output, must fail: one softmax over image and text keys together (Wan sums two), learned positions
instead of RoPE, and the norm2/norm3 swap undone (the affine norm before the FFN, the plain one
before cross-attention).
"""
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainkit.models import build_model
from trainkit.models.dreamzero import model as dz
from trainkit.models.dreamzero.weights import diffusers_name

ROOT = Path(__file__).resolve().parents[4]
ORACLE_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "diffusers_oracle" / "wan_oracle.py"
# diffusers draws the time sinusoid in float32, Wan (and trainkit) in float64: at timestep 700 the
# angles differ by ~4e-5, which the rest carries: measured max |diff| of the output 1.1e-5 at these
# timesteps (torch 2.13 CPU); the controls below miss by far more
TOL = dict(rtol=2e-4, atol=5e-5)
OVERRIDES = {"text_len": 512, "first_frame_concat": True}  # diffusers splits the context at 512 text tokens


def diffusers_config(cfg) -> dict:
    return dict(patch_size=cfg.patch, num_attention_heads=cfg.heads, attention_head_dim=cfg.head_dim,
                in_channels=cfg.in_dim, out_channels=cfg.latent_channels, text_dim=cfg.text_width,
                freq_dim=cfg.freq_dim, ffn_dim=cfg.ffn, num_layers=cfg.depth, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=cfg.eps, image_dim=cfg.image_width, added_kv_proj_dim=cfg.dim)


def one_softmax(self, x, text, image):
    b, h = x.shape[0], self.heads
    heads = lambda z: z.view(b, z.shape[1], h, -1).transpose(1, 2)  # noqa: E731
    k = torch.cat([self.norm_k_img(self.k_img(image)), self.norm_k(self.k(text))], dim=1)
    v = torch.cat([self.v_img(image), self.v(text)], dim=1)
    out = F.scaled_dot_product_attention(heads(self.norm_q(self.q(x))), heads(k), heads(v))
    return self.o(out.transpose(1, 2).flatten(2))


def norms_unswapped(self, x, e0, text, image, layout):
    mod = self.modulation.float()[:, None] + e0
    segs = layout.seq.segments
    x = x + dz.gated(self.self_attn(dz.segmented(self.norm1(x), mod, segs, 0, 1), layout), mod, segs, 2)
    x = x + self.cross_attn(self.norm2(x), text, image)
    return x + dz.gated(self.ffn(dz.segmented(self.norm3(x), mod, segs, 3, 4)), mod, segs, 5)


@pytest.mark.skipif(not (ORACLE_PY.parents[1] / ".ready").exists(), reason=f"no oracle venv at {ORACLE_PY.parents[1]}")
def test_plain_wan_equals_diffusers_wan_transformer(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = build_model("dreamzero", "tiny", OVERRIDES)
    cfg = model.cfg
    with torch.no_grad():  # non-trivial values everywhere (the init has a zero head, unit norms, zero biases)
        for n, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.ndim > 1 else 0.3))
    wan_params = {n: p for n, p in model.named_parameters()
                  if not n.startswith(("state_encoder", "action_encoder", "action_decoder"))}
    b, (h, w) = 2, cfg.latent_hw
    g = torch.Generator().manual_seed(1)
    x_t = torch.randn(b, cfg.latent_channels, cfg.latent_frames, h, w, generator=g)
    cond = torch.randn(b, 4 + cfg.latent_channels, cfg.latent_frames, h, w, generator=g)
    text = torch.randn(b, cfg.text_len, cfg.text_width, generator=g)
    text[1, 7:] = 0  # a short prompt, zero-padded as Wan pads
    image = torch.randn(b, cfg.image_tokens, cfg.image_width, generator=g)
    timestep = torch.tensor([700.0, 37.5])
    target = torch.randn_like(x_t)
    weight = torch.rand(b, cfg.latent_frames, generator=g) + 0.5

    def ours():
        model.zero_grad(set_to_none=True)
        out = model.wan(x_t, timestep, text, image, cond)
        loss = (((out - target) ** 2).mean(dim=(1, 3, 4)) * weight).mean()
        loss.backward()
        return out.detach(), loss.detach()

    out, loss = ours()
    grads = {n: p.grad.clone() for n, p in wan_params.items()}
    doc = {"config": diffusers_config(cfg), "weights": {n: p.detach().clone() for n, p in wan_params.items()},
           "inputs": {"hidden_states": torch.cat([x_t, cond], dim=1), "timestep": timestep,
                      "encoder_hidden_states": text, "encoder_hidden_states_image": image, "target": target,
                      "weight": weight}}
    torch.save(doc, tmp_path / "in.pt")
    subprocess.run([str(ORACLE_PY), str(ORACLE), str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], check=True,
                   timeout=300, env={**os.environ, "PYTHONPATH": ""})
    want = torch.load(tmp_path / "out.pt", weights_only=False)
    torch.testing.assert_close(out, want["out"], **TOL)
    torch.testing.assert_close(loss, want["loss"], **TOL)
    assert set(want["grads"]) == set(grads)  # every parameter gets a gradient on both sides
    assert {k: diffusers_name(k) for k in grads} == want["names"]  # weights.py's table is diffusers' conversion
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want["grads"][name], **TOL, msg=lambda m: f"{name}: {m}")

    # positive controls: each variant of the block, same weights, inputs and oracle output, must differ
    positions = torch.randn(cfg.latent_frames * cfg.tokens_per_frame, cfg.dim, generator=g)
    controls = {
        "one softmax": [(dz.CrossAttention, "forward", one_softmax)],
        "learned positions": [(dz, "apply_rope", lambda x, cos, sin: x),
                              (dz.DreamZero, "embed_video", lambda self, x, c, f=dz.DreamZero.embed_video:
                               f(self, x, c) + positions)],
        "norm2/norm3 swap undone": [(dz.WanBlock, "forward", norms_unswapped)],
    }
    for name, patches in controls.items():
        with monkeypatch.context() as m:
            for target_obj, attr, value in patches:
                m.setattr(target_obj, attr, value)
            wrong, _ = ours()
        with pytest.raises(AssertionError):
            torch.testing.assert_close(wrong, want["out"], **TOL)

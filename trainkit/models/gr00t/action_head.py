"""The `gr00t` action head: N1.6's flow-matching DiT with alternating cross-attention, its state and
action encoders, action decoder and learned action positions (Isaac-GR00T `FlowmatchingActionHead`
with `AlternateVLDiT`, one embodiment, `vl_self_attention` off, state dropout 0).

Sequence: [1 state token; horizon action tokens], width dit_width. Block i: odd i self-attends over
that sequence; even i cross-attends to the VL tokens, the text tokens when i % 4 == 0 and the image
tokens when i % 4 == 2 (a key mask in N1.6; here the slice of the VL sequence it selects, which is
the same attention). Each block: AdaLayerNorm on the flow time (LayerNorm without affine, then
(1 + scale, shift) from silu(temb)), attention with biases, residual, LayerNorm without affine,
tanh-GELU feed-forward, residual. Out: LayerNorm with (shift, scale) from the time, a projection
to head_hidden, and the decoder MLP to action_dim; the prediction is the velocity of the last
`horizon` tokens. The time enters as a bucket id t_bucket = floor(t x time_buckets): through
diffusers' sinusoidal `Timesteps(256, flip_sin_to_cos, shift 1)` + MLP for the AdaLayerNorms, and
through N1.6's sinusoidal encoding into the action encoder.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TIME_FEATURES = 256  # channels of the sinusoidal time features fed to the time MLP


def time_features(buckets: torch.Tensor, dim: int = TIME_FEATURES) -> torch.Tensor:
    """diffusers `get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=1)`: (B, dim) fp32."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32, device=buckets.device) / (half - 1))
    angle = buckets.float()[:, None] * freqs[None]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def action_time_encoding(buckets: torch.Tensor, dim: int) -> torch.Tensor:
    """N1.6's `SinusoidalPositionalEncoding` of the time bucket: (B, dim) fp32, [sin, cos]."""
    half = dim // 2
    freqs = torch.exp(-torch.arange(half, dtype=torch.float32, device=buckets.device) * (math.log(10_000.0) / half))
    angle = buckets.float()[:, None] * freqs[None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


class DiTBlock(nn.Module):
    """One DiT block; `context_dim` > 0: it cross-attends to a context of that width, else self-attends."""

    def __init__(self, dim: int, heads: int, ff: int, context_dim: int = 0):
        super().__init__()
        self.heads = heads
        self.cross = context_dim > 0
        self.ada = nn.Linear(dim, 2 * dim)  # AdaLayerNorm: (scale, shift) from silu(temb)
        if self.cross:
            self.q = nn.Linear(dim, dim)
            self.kv = nn.Linear(context_dim, 2 * dim)
        else:
            self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ff_in = nn.Linear(dim, ff)
        self.ff_out = nn.Linear(ff, dim)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor | None,
                context_keep: torch.Tensor | None) -> torch.Tensor:
        """x (B, S, D), temb (B, D), context (B, C, Dc) and its valid keys (B, C) bool (cross blocks)."""
        b, s, d = x.shape
        scale, shift = self.ada(F.silu(temb)).chunk(2, dim=-1)
        h = F.layer_norm(x, (d,), eps=1e-5) * (1 + scale[:, None]) + shift[:, None]
        if self.cross:
            q = self.q(h)
            k, v = self.kv(context).chunk(2, dim=-1)
            mask = context_keep[:, None, None, :]
        else:
            q, k, v = self.qkv(h).chunk(3, dim=-1)
            mask = None
        heads = lambda t: t.reshape(b, t.shape[1], self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        attn = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.ff_out(F.gelu(self.ff_in(F.layer_norm(x, (d,), eps=1e-5)), approximate="tanh"))


class MLP2(nn.Module):
    """Linear -> ReLU -> Linear (N1.6's CategorySpecificMLP for one embodiment)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class ActionEncoder(nn.Module):
    """N1.6's MultiEmbodimentActionEncoder (one embodiment): W3(swish(W2([W1(a); enc(t)])))."""

    def __init__(self, action_dim: int, dim: int):
        super().__init__()
        self.w1 = nn.Linear(action_dim, dim)
        self.w2 = nn.Linear(2 * dim, dim)
        self.w3 = nn.Linear(dim, dim)

    def forward(self, actions: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
        a = self.w1(actions)
        tau = action_time_encoding(buckets, a.shape[-1]).to(a.dtype)[:, None].expand_as(a)
        return self.w3(F.silu(self.w2(torch.cat([a, tau], dim=-1))))


class TimeEmbedding(nn.Module):
    """diffusers `TimestepEmbedding`: Linear -> SiLU -> Linear of the sinusoidal time features."""

    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(TIME_FEATURES, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, buckets: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.fc1(time_features(buckets).to(self.fc1.weight.dtype))))


class OutputHead(nn.Module):
    """The DiT's output: LayerNorm (no affine) with (shift, scale) from silu(temb), then a projection."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.ada = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = self.ada(F.silu(temb)).chunk(2, dim=-1)
        x = F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return self.proj(x)


def block_context(idx: int) -> str:
    """What DiT block `idx` attends to: "text" (idx % 4 == 0), "image" (idx % 4 == 2) or "self" (odd)."""
    return "self" if idx % 2 else ("text" if idx % 4 == 0 else "image")

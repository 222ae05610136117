"""The `gr00t` action head: GR00T N1.7's flow-matching head (LeRobot 0.6.1 `GR00TN17ActionHead` with
`AlternateVLDiT` and `SelfAttentionTransformer`; Isaac-GR00T's `gr00t_n1d7` module): the VL self-attention
blocks, the DiT with alternating cross-attention, the per-embodiment state and action encoders and
action decoder, and the learned action positions.

VL path: LayerNorm (`vlln`, in model.py), then `vl_layers` pre-norm transformer blocks (LayerNorm with
affine, self-attention with biases, LayerNorm, tanh-GELU feed-forward of 4 x width) over every VL
token. LeRobot's blocks take no mask: text padding is attended as there; only the tokens of a camera
slot the sample lacks (its whole run, which LeRobot never has: the model's `seen`) are hidden, so a
batch with a slot pruned and one with it padded give the same features.
DiT sequence: [1 state token; horizon action tokens], width dit_width. Block i: odd i self-attends over
that sequence; even i cross-attends to the VL tokens, the text tokens (every valid non-image token)
when i % 4 == 0 and the valid image tokens when i % 4 == 2, as key masks over the whole VL sequence.
Each block: AdaLayerNorm on the flow time (LayerNorm without affine, then (1 + scale, shift) from
silu(temb)), attention with biases, residual, LayerNorm without affine, tanh-GELU feed-forward,
residual. Out: LayerNorm with (shift, scale) from the time, a projection to head_hidden, and the
decoder MLP to action_dim; the prediction is the velocity of the last `horizon` tokens. The time
enters as a bucket id t_bucket = floor(t x time_buckets): through diffusers' sinusoidal
`Timesteps(256, flip_sin_to_cos, shift 1)` + MLP for the AdaLayerNorms, and through GR00T's
sinusoidal encoding into the action encoder.
Dropout (training only) sits where diffusers puts it: twice on the attention output (the `Attention`
output dropout and the block's `final_dropout`), after the GELU, and after the feed-forward's output.
Per-embodiment layers hold one embodiment's slice of the checkpoint's (embodiments, in, out) tensors,
applied as x @ W + b (weights.py reads and writes the slice).
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
    """GR00T's `SinusoidalPositionalEncoding` of the time bucket: (B, dim) fp32, [sin, cos]."""
    half = dim // 2
    freqs = torch.exp(-torch.arange(half, dtype=torch.float32, device=buckets.device) * (math.log(10_000.0) / half))
    angle = buckets.float()[:, None] * freqs[None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, skipped outright at p = 0 or in eval (no RNG draw, nothing saved)."""
    return F.dropout(x, p, True) if training and p > 0 else x


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, keep: torch.Tensor | None) -> torch.Tensor:
    """Multi-head attention of (B, S, D) queries over (B, C, D) keys/values; keep (B, C) bool valid keys or None."""
    b, s, d = q.shape
    split = lambda t: t.reshape(b, t.shape[1], heads, d // heads).transpose(1, 2)  # noqa: E731
    mask = None if keep is None else keep[:, None, None, :]
    return F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask).transpose(1, 2).reshape(b, s, d)


class FeedForward(nn.Module):
    """diffusers' FeedForward("gelu-approximate", final_dropout): Linear -> tanh-GELU -> dropout -> Linear -> dropout."""

    def __init__(self, dim: int, ff: int):
        super().__init__()
        self.ff_in = nn.Linear(dim, ff)
        self.ff_out = nn.Linear(ff, dim)

    def forward(self, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        h = dropout(F.gelu(self.ff_in(x), approximate="tanh"), p, training)
        return dropout(self.ff_out(h), p, training)


class VLBlock(nn.Module):
    """One block of the VL self-attention (diffusers' BasicTransformerBlock, layer_norm): pre-norm
    self-attention and feed-forward, LayerNorms with affine."""

    def __init__(self, dim: int, heads: int, p: float):
        super().__init__()
        self.heads, self.p = heads, p
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, 4 * dim)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, D); keep (B, T) bool keys every token may attend to, or None (all)."""
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attn = self.out(attend(q, k, v, self.heads, keep))
        x = x + dropout(dropout(attn, self.p, self.training), self.p, self.training)
        return x + self.ff(self.norm3(x), self.p, self.training)


class DiTBlock(nn.Module):
    """One DiT block; `context_dim` > 0: it cross-attends to a context of that width, else self-attends."""

    def __init__(self, dim: int, heads: int, ff: int, context_dim: int = 0, p: float = 0.0):
        super().__init__()
        self.heads, self.p = heads, p
        self.cross = context_dim > 0
        self.ada = nn.Linear(dim, 2 * dim)  # AdaLayerNorm: (scale, shift) from silu(temb)
        if self.cross:
            self.q = nn.Linear(dim, dim)
            self.kv = nn.Linear(context_dim, 2 * dim)
        else:
            self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ff = FeedForward(dim, ff)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor | None,
                context_keep: torch.Tensor | None) -> torch.Tensor:
        """x (B, S, D), temb (B, D), context (B, C, Dc) and its valid keys (B, C) bool (cross blocks)."""
        d = x.shape[-1]
        scale, shift = self.ada(F.silu(temb)).chunk(2, dim=-1)
        h = F.layer_norm(x, (d,), eps=1e-5) * (1 + scale[:, None]) + shift[:, None]
        if self.cross:
            q = self.q(h)
            k, v = self.kv(context).chunk(2, dim=-1)
        else:
            q, k, v = self.qkv(h).chunk(3, dim=-1)
        attn = self.out(attend(q, k, v, self.heads, context_keep if self.cross else None))
        x = x + dropout(dropout(attn, self.p, self.training), self.p, self.training)
        return x + self.ff(F.layer_norm(x, (d,), eps=1e-5), self.p, self.training)


class EmbodimentLinear(nn.Module):
    """One embodiment's slice of GR00T's CategorySpecificLinear: x @ weight + bias, weight (in, out)
    as the checkpoint stores W[embodiment]."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class MLP2(nn.Module):
    """layer1 -> ReLU -> layer2, per embodiment (GR00T's CategorySpecificMLP for one embodiment)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.layer1 = EmbodimentLinear(in_dim, hidden)
        self.layer2 = EmbodimentLinear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x)))


class ActionEncoder(nn.Module):
    """GR00T's MultiEmbodimentActionEncoder (one embodiment): W3(swish(W2([W1(a); enc(t)])))."""

    def __init__(self, action_dim: int, dim: int):
        super().__init__()
        self.W1 = EmbodimentLinear(action_dim, dim)
        self.W2 = EmbodimentLinear(2 * dim, dim)
        self.W3 = EmbodimentLinear(dim, dim)

    def forward(self, actions: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
        a = self.W1(actions)
        tau = action_time_encoding(buckets, a.shape[-1]).to(a.dtype)[:, None].expand_as(a)
        return self.W3(F.silu(self.W2(torch.cat([a, tau], dim=-1))))


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

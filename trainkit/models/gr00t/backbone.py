"""The frozen-then-trained vision-language backbone of `gr00t`: the SigLIP2-style tower, the 2x2
pixel-unshuffle + MLP connector, and the Qwen3-style LLM layer (qk-norm, grouped-query, causal).

The LLM runs over [image tokens of the kept slots; text tokens] with a causal mask that also hides
the image tokens of a slot a sample leaves empty. Text padding needs no mask: it sits at the end,
and a causal query never sees a later key. Every query sees itself, so the row of a masked token is
never empty (no NaN; its output is never read by a valid token). Positions (RoPE) count valid
tokens only, so pruning an empty slot and masking it give the same features.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainkit.models.gr00t.config import UNSHUFFLE
from trainkit.models.layers import RMSNorm, apply_rope


def pixel_unshuffle(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(N, rows * cols, D) patch tokens in row-major order -> (N, rows/2 * cols/2, 4D): each 2x2
    neighbourhood becomes one token, its four patches' channels concatenated row by row."""
    n, _, d = x.shape
    u = UNSHUFFLE
    x = x.view(n, rows // u, u, cols // u, u, d).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (rows // u) * (cols // u), u * u * d)


class Connector(nn.Module):
    """Eagle's mlp1: LayerNorm(4 x vision) -> Linear -> GELU -> Linear, to the LLM width."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(in_dim)
        self.fc1 = nn.Linear(in_dim, out_dim)
        self.fc2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


def causal_keep_mask(keep: torch.Tensor) -> torch.Tensor:
    """(B, T) valid tokens -> (B, 1, T, T) bool attention mask: causal, valid keys only, and every
    query its own key (so no row is empty)."""
    t = keep.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=keep.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=keep.device)
    return (causal & (keep[:, None, :] | eye))[:, None]


class Qwen3Layer(nn.Module):
    """One Qwen3 decoder layer: RMSNorm, QKV (no bias), per-head RMSNorm on q and k, RoPE, causal
    grouped-query attention, O-projection, RMSNorm, SwiGLU."""

    def __init__(self, dim: int, mlp: int, heads_q: int, heads_kv: int, head_dim: int):
        super().__init__()
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, head_dim
        self.norm_attn = RMSNorm(dim)
        self.qkv = nn.Linear(dim, (heads_q + 2 * heads_kv) * head_dim, bias=False)
        self.q_norm = RMSNorm(head_dim)
        self.k_norm = RMSNorm(head_dim)
        self.out = nn.Linear(heads_q * head_dim, dim, bias=False)
        self.norm_mlp = RMSNorm(dim)
        self.gate_up = nn.Linear(dim, 2 * mlp, bias=False)
        self.down = nn.Linear(mlp, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), cos/sin (B, T, 1, hd/2), mask (B, 1, T, T) bool (causal_keep_mask)."""
        b, t, _ = x.shape
        hq, hkv, hd = self.heads_q, self.heads_kv, self.head_dim
        q, k, v = self.qkv(self.norm_attn(x)).split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        q = apply_rope(self.q_norm(q.view(b, t, hq, hd)), cos, sin).transpose(1, 2)
        k = apply_rope(self.k_norm(k.view(b, t, hkv, hd)), cos, sin).transpose(1, 2)
        v = v.view(b, t, hkv, hd).transpose(1, 2)
        # K/V repeated per query group: with a mask only cuDNN takes unequal head counts (layers.py)
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, hq * hd))
        gate, up = self.gate_up(self.norm_mlp(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

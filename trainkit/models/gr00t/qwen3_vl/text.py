"""Qwen3-VL's language model (Cosmos-Reason2-2B / GR00T N1.7), its first `select_layer` layers.

One layer: RMSNorm, q/k/v projections (no bias), per-head RMSNorm on q and k, interleaved mRoPE
(mrope.py), causal grouped-query attention over the valid tokens, O-projection, RMSNorm, SwiGLU.
Parameter names are transformers' (`layers.i.self_attn.q_proj`, `layers.i.mlp.gate_proj`,
`layers.i.input_layernorm`...), so a checkpoint loads by prefix; the final norm is not built (N1.7
reads the features before it).

Padding: keys are the valid tokens at or before the query (transformers' causal and padding
mask). A query with none (a left pad: LeRobot pads on the left) gets an attention output of 0 in
transformers' SDPA path (torch >= 2.5's safe softmax); N1.7's `vl_self_attention` later attends to
padded positions without a mask, so their features must match too. Here such a row sees only
itself (no empty row, no NaN on any kernel) and its attention output is multiplied by 0: the same
features, exactly, for left and right padding.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainkit.models.gr00t.qwen3_vl.config import Qwen3VLConfig
from trainkit.models.layers import RMSNorm, apply_rope


def padded_causal_mask(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) real tokens -> ((B, 1, T, T) bool mask: causal over valid keys, a query with no valid
    key at or before it its own key only; (B, T) bool: the queries that do have a valid key)."""
    t = valid.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=valid.device)
    seen = valid.long().cumsum(dim=1) > 0
    return (causal & (valid[:, None, :] | (eye & ~seen[:, :, None])))[:, None], seen


class TextAttention(nn.Module):
    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.heads_q, self.heads_kv, self.head_dim = cfg.heads_q, cfg.heads_kv, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads_q * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.heads_kv * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.heads_kv * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads_q * cfg.head_dim, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                seen: torch.Tensor) -> torch.Tensor:
        """`mask` and `seen` as `padded_causal_mask` gives them."""
        b, t, _ = x.shape
        hq, hkv, hd = self.heads_q, self.heads_kv, self.head_dim
        q = apply_rope(self.q_norm(self.q_proj(x).view(b, t, hq, hd)), cos, sin).transpose(1, 2)
        k = apply_rope(self.k_norm(self.k_proj(x).view(b, t, hkv, hd)), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(b, t, hkv, hd).transpose(1, 2)
        # K/V repeated per query group: with a mask only cuDNN takes unequal head counts (layers.py)
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, hq * hd)
        return self.o_proj(out * seen[:, :, None].to(out.dtype))


class TextMLP(nn.Module):
    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.mlp, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.mlp, bias=False)
        self.down_proj = nn.Linear(cfg.mlp, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TextLayer(nn.Module):
    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.self_attn = TextAttention(cfg)
        self.mlp = TextMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                seen: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, seen)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    """Token embedding and the first `select_layer` decoder layers (no final norm)."""

    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(TextLayer(cfg) for _ in range(cfg.select_layer))

"""The mixture-of-transformers (MoT) layer of Pi0/Pi0.5: two experts (the VLM backbone for the
prefix, the action expert for the suffix), each with its own norms, Q/K/V/O projections and MLP,
sharing one joint attention per layer (`layers.prefix_suffix_attention`, or the mask-free
`varlen_attention.varlen_prefix_suffix_attention` when `parallel.attention = "varlen"`).

The action expert's norms are adaRMSNorm conditioned on the flow time: one linear per layer maps
the time embedding to (scale, shift, gate) for each of its two norms. Gates enter as (1 + gate), so
a zero-initialised modulation is exactly the plain pre-norm block.

The last layer's prefix output is never read (only its K/V feed the suffix), so that layer is built
with `prefix_out=False`: its prefix half projects only K/V (no queries, no prefix attention, no
O-projection, post-norm or MLP). This skips ~3% of the FLOPs and leaves no parameter without a
gradient (which FSDP and DDP handle badly).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from trainkit.models.layers import GeGLU, RMSNorm, ada_rms_norm, apply_rope, prefix_suffix_attention


class ExpertHalf(nn.Module):
    """One expert's weights inside a MoT layer. `adaptive`: adaRMSNorm modulated by `cond_dim`
    features; `with_out`: build the O-projection, post-norm and MLP (False for the last prefix half)."""

    def __init__(self, dim: int, mlp: int, heads_q: int, heads_kv: int, head_dim: int,
                 adaptive_cond: int = 0, with_out: bool = True):
        super().__init__()
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, head_dim
        self.norm_attn = None if adaptive_cond else RMSNorm(dim)
        self.with_out = with_out
        # without an output the half's queries are never used: project only K and V
        self.qkv = nn.Linear(dim, ((heads_q if with_out else 0) + 2 * heads_kv) * head_dim, bias=False)
        # (scale, shift, gate) for the attention norm and for the MLP norm
        self.ada = nn.Linear(adaptive_cond, 6 * dim) if adaptive_cond else None
        self.out = self.norm_mlp = self.mlp = None
        if with_out:
            self.out = nn.Linear(heads_q * head_dim, dim, bias=False)
            self.norm_mlp = None if adaptive_cond else RMSNorm(dim)
            self.mlp = GeGLU(dim, mlp)

    def modulation(self, cond: torch.Tensor | None) -> list[torch.Tensor] | None:
        """Six (B, 1, D) modulation tensors from the conditioning, or None for a plain expert."""
        if self.ada is None or cond is None:
            return None
        return list(self.ada(cond).unsqueeze(1).chunk(6, dim=-1))

    def qkv_heads(self, x: torch.Tensor, mod: list[torch.Tensor] | None, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Normalise, project and rotate, token-major: q (B, T, Hq, hd) (None without output), k and v (B, T, Hkv, hd)."""
        b, t, _ = x.shape
        h = self.norm_attn(x) if mod is None else ada_rms_norm(x, mod[0], mod[1])
        kv = self.heads_kv * self.head_dim
        q_dim = self.heads_q * self.head_dim if self.with_out else 0
        q, k, v = self.qkv(h).split([q_dim, kv, kv], dim=-1)
        k = k.view(b, t, self.heads_kv, self.head_dim)
        v = v.view(b, t, self.heads_kv, self.head_dim)
        if not self.with_out:
            return None, apply_rope(k, cos, sin), v
        q = q.view(b, t, self.heads_q, self.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor, mod: list[torch.Tensor] | None) -> torch.Tensor:
        """Residual O-projection then residual MLP (gated by 1 + gate when adaptive)."""
        y = self.out(attn)  # attn: (B, T, Hq * hd)
        if mod is None:
            x = x + y
            return x + self.mlp(self.norm_mlp(x))
        x = x + y * (1 + mod[2])
        return x + self.mlp(ada_rms_norm(x, mod[3], mod[4])) * (1 + mod[5])


class MoTLayer(nn.Module):
    """One Pi0.5 layer holding both experts' weights; forward maps (prefix, suffix) hidden states."""

    def __init__(self, *, lm_width: int, lm_mlp: int, expert_width: int, expert_mlp: int,
                 heads_q: int, heads_kv: int, head_dim: int, prefix_out: bool = True):
        super().__init__()
        self.prefix_out = prefix_out
        self.lm = ExpertHalf(lm_width, lm_mlp, heads_q, heads_kv, head_dim, with_out=prefix_out)
        self.expert = ExpertHalf(expert_width, expert_mlp, heads_q, heads_kv, head_dim, adaptive_cond=expert_width)
        # the joint attention function; parallel.attention swaps in a mask-free one of the same
        # signature and function (trainkit/parallel/attention.py)
        self.joint_attention = prefix_suffix_attention

    def forward(self, xp: torch.Tensor, xs: torch.Tensor, cond: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, prefix_keep: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """xp (B, P, Dlm), xs (B, A, Dex), cond (B, Dex) time features, cos/sin (B, P+A, 1, hd/2)
        RoPE tables of the whole sequence, prefix_keep (B, P) bool or None (all valid).
        Returns (new prefix, new suffix); the prefix is None for the last layer (never read:
        returning the input itself would hand FSDP2 a view of its own hook output)."""
        p = xp.shape[1]
        mod = self.expert.modulation(cond)
        qp, kp, vp = self.lm.qkv_heads(xp, None, cos[:, :p], sin[:, :p])
        qs, ks, vs = self.expert.qkv_heads(xs, mod, cos[:, p:], sin[:, p:])
        attn_p, attn_s = self.joint_attention(qp, kp, vp, qs, ks, vs, prefix_keep)
        xs = self.expert.finish(xs, attn_s, mod)
        return (self.lm.finish(xp, attn_p, None) if self.prefix_out else None), xs

"""Building blocks shared by trainkit model families: norms, GeGLU MLP, RoPE, the SigLIP block and
the prefix/suffix joint attention of a mixture-of-transformers (MoT) layer.

Every op is a plain tensor op (no Python loop over tokens, no `.item()`, no data-dependent shape),
so blocks compile with torch.compile and capture in CUDA graphs. Attention goes through
`F.scaled_dot_product_attention` (flash / efficient / cuDNN kernels on GPU).

Grouped-query attention (Pi0.5: 8 query heads, 1 K/V head) folds the query heads of each K/V group
into the query sequence: q (B, T, Hkv*G, hd) is viewed as (B, Hkv, T*G, hd), so SDPA runs with
Hkv heads and no repeated K/V. With Hkv = 1 this is a free view of the projection output, and the
attention output is a free view of the O-projection input. Why not `enable_gqa=True`: with a mask
(real batches always carry one: text padding) only cuDNN attention takes unequal head counts; flash
rejects masks and efficient attention rejects unequal heads, so without cuDNN it falls back to the
math kernel (scores materialised). The fold runs on any fused kernel. Measured on one H200, torch
2.11, B=32, 8q/1kv heads x 256, 712 tokens, fwd+bwd: enable_gqa + mask 2.92 ms, fold + mask 2.90 ms
(both cuDNN); with cuDNN disabled enable_gqa + mask has no fused kernel, the fold runs on efficient
attention (14.5 ms).
Tensors of the MoT attention are token-major: (B, T, heads, head_dim).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """RMSNorm with a learned per-channel scale (Gemma's norm; fused `F.rms_norm` kernel)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def ada_rms_norm(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """adaRMSNorm: RMS-normalise without a learned weight, then modulate by a per-sample
    (scale, shift) computed from the conditioning (Pi0.5 conditions the action expert on flow time).
    `scale`/`shift` are (B, 1, D) and broadcast over tokens; zero modulation is the plain norm."""
    return F.rms_norm(x, (x.shape[-1],), None, eps) * (1 + scale) + shift


class GeGLU(nn.Module):
    """Gemma's gated MLP: down(gelu_tanh(gate(x)) * up(x)); gate and up are one fused matmul."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float = 10_000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (B, T, 1, head_dim/2) in fp32 for integer `positions` (B, T).
    Positions are per token (not arange), so masked tokens need not advance them."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, :, None, None] * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate token-major (B, T, H, head_dim) by the tables, split-half layout (as Gemma); in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class SiglipBlock(nn.Module):
    """One SigLIP encoder block: pre-LayerNorm, bidirectional multi-head attention, GELU MLP (with biases)."""

    def __init__(self, dim: int, mlp: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attn.transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      key_keep: torch.Tensor | None) -> torch.Tensor:
    """Bidirectional attention of token-major q (B, Tq, Hq, hd) over k, v (B, Tk, Hkv, hd), query
    head h using K/V head h // (Hq / Hkv); `key_keep` (B, Tk) bool masks keys (None: no mask, flash
    path). Returns (B, Tq, Hq * hd). Query heads are folded into the sequence (module docstring)."""
    b, tq, hq, hd = q.shape
    hkv = k.shape[2]
    folded = q.reshape(b, tq, hkv, hq // hkv, hd).transpose(1, 2).reshape(b, hkv, tq * (hq // hkv), hd)
    mask = None if key_keep is None else key_keep[:, None, None, :]
    out = F.scaled_dot_product_attention(folded, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.reshape(b, hkv, tq, hq // hkv, hd).transpose(1, 2).reshape(b, tq, hq * hd)


def prefix_suffix_attention(
    qp: torch.Tensor | None, kp: torch.Tensor, vp: torch.Tensor,
    qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
    prefix_keep: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The joint attention of a MoT layer over [prefix; suffix] with the Pi0 block mask:
    prefix queries see valid prefix keys (bidirectional), suffix queries see valid prefix keys and
    every suffix key, and the prefix never sees the suffix.

    Token-major q: (B, T, Hq, hd), k/v: (B, T, Hkv, hd) per part; returns (B, T, Hq * hd) per part.
    `prefix_keep` (B, P) bool marks valid prefix tokens, or None when all are valid (then no mask
    is built and SDPA may take the flash path). Done as two SDPA calls instead of one dense
    (P+A)^2 mask: the prefix x suffix block is all masked, so skipping it saves its FLOPs and the
    mask is only a (B, 1, 1, keys) key-padding mask. Every sample must have at least one valid
    prefix token (else its prefix rows are all masked: NaN); the tokenizer always emits BOS.
    `qp` None: skip the prefix queries (returns None for them)."""
    mask_s = None
    if prefix_keep is not None:
        suffix_keep = torch.ones(qs.shape[0], qs.shape[1], dtype=torch.bool, device=qs.device)
        mask_s = torch.cat([prefix_keep, suffix_keep], dim=1)
    out_p = None if qp is None else grouped_attention(qp, kp, vp, prefix_keep)
    out_s = grouped_attention(qs, torch.cat([kp, ks], dim=1), torch.cat([vp, vs], dim=1), mask_s)
    return out_p, out_s


def seeded_normal_(p: torch.Tensor, key: int, std: float) -> None:
    """Fill `p` with N(0, std) drawn in fp32 from its own generator seeded by `key`, the same values
    whether `p` is a plain tensor, a bf16 copy or an FSDP2 shard (a DTensor: its local part of
    the full draw). The global RNG's stream depends on the layout (a DTensor draws its shard), so
    a family whose parallel plans differ in which parameters FSDP holds initialises through this."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    local = p.to_local() if isinstance(p, DTensor) else p
    if local.is_meta:  # built on meta: materialised and initialised later
        return
    full = torch.empty(p.shape, dtype=torch.float32, device=local.device)
    nn.init.normal_(full, std=std, generator=torch.Generator(device=full.device).manual_seed(key))
    if isinstance(p, DTensor):
        full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    local.copy_(full)

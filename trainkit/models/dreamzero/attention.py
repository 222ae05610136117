"""Block-causal self-attention of the `dreamzero` sequence (sequence.py), three ways, one contract:
q, k, v token-major (B, T, H, hd) -> (B, T, H * hd).

- "blocks": one unmasked SDPA per part of the pattern (`TokenSequence.calls`): a clean block's queries over
  the clean prefix, a noisy group's over the clean prefix before it plus the group (its key spans
  concatenated). No mask, so the fused kernels (flash / cuDNN / efficient) run, and only the
  block-causal work is done: 30% of full attention's pairs at the 5b shapes.
- "flex": FlexAttention with a block mask from the same pattern (CUDA; tiles of 128 tokens, the
  ones cut by a part boundary evaluated by the mask function, a lookup in the dense mask).
- "dense": SDPA with the dense (T, T) mask: full attention's cost, the reference.
Measured on one H200 at the 5b shapes: bench/results/dreamzero_h200.md (attention).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from trainkit.models.dreamzero.sequence import TokenSequence


def block_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq: TokenSequence,
                           kernel: str = "blocks") -> torch.Tensor:
    """Attention of token-major q, k, v (B, T, H, hd) under the sequence's block-causal pattern."""
    b, t, h, hd = q.shape
    if kernel == "blocks":
        out = blocks_attention(q, k, v, seq)
    elif kernel == "flex":
        out = flex_attention(q, k, v, seq)
    elif kernel == "dense":
        mask = dense_mask(seq, q.device)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask).transpose(1, 2)
    else:
        raise ValueError(f"attention kernel {kernel!r} is not one of blocks, flex, dense")
    return out.reshape(b, t, h * hd)


def blocks_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq: TokenSequence) -> torch.Tensor:
    """One SDPA per call of the pattern; (B, T, H, hd) out, in token order."""
    outs = []
    for (q0, q1), keys in seq.calls:
        if len(keys) == 1:
            (k0, k1), = keys
            kk, vv = k[:, k0:k1], v[:, k0:k1]
        else:  # a noisy group: the clean prefix before it, then the group
            kk = torch.cat([k[:, k0:k1] for k0, k1 in keys], dim=1)
            vv = torch.cat([v[:, k0:k1] for k0, k1 in keys], dim=1)
        o = F.scaled_dot_product_attention(q[:, q0:q1].transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2))
        outs.append(o.transpose(1, 2))
    return torch.cat(outs, dim=1)


def dense_mask(seq: TokenSequence, device: torch.device) -> torch.Tensor:
    return _dense_mask(seq, str(device))


@lru_cache(maxsize=8)
def _dense_mask(seq: TokenSequence, device: str) -> torch.Tensor:
    return seq.dense_mask().to(device)


def flex_mask_mod(seq: TokenSequence, device: str):
    """FlexAttention's mask_mod(b, h, q, k) -> bool of the pattern: a lookup in its dense mask."""
    dense = dense_mask(seq, torch.device(device))

    def allowed(b, h, qi, ki):
        return dense[qi, ki]

    return allowed


@lru_cache(maxsize=8)
def _block_mask(seq: TokenSequence, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(flex_mask_mod(seq, device), None, None, seq.total, seq.total, device=device)


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention as flex
    return torch.compile(flex, dynamic=False)  # eager flex materialises the scores; compiled it is one kernel


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq: TokenSequence) -> torch.Tensor:
    """FlexAttention (compiled once per process) with the sequence's block mask; (B, T, H, hd) out."""
    mask = _block_mask(seq, str(q.device))
    out = _compiled_flex()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask)
    return out.transpose(1, 2)

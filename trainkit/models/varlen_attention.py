"""The joint attention of a MoT layer without a dense mask: valid keys packed, a variable-length kernel.

`prefix_suffix_attention` (layers.py) hands SDPA a key-padding mask, which keeps head_dim 256 on
cuDNN's masked kernel. This computes the same function with no mask at all: per sample the valid
keys are moved to the front of one packed key buffer (a stable permutation, no data-dependent
shape, no host sync), and `torch.nn.attention.varlen.varlen_attn` (FlashAttention-2 varlen) runs
every sample as its own segment of `cu_seq_k`. Queries are not packed: a padded query row attends
the valid keys as in the masked version, and its output is never read.

Query heads are folded into the query sequence as in `grouped_attention` (with one K/V head a free
view), so each (sample, K/V head) is one segment with one head. Rows of the packed key buffer past
the last segment hold the padding keys; the kernel never reads them, and their gradients (which it
leaves unwritten) are cut by a `where`. Why: the mask costs ~1.1 ms per layer at B = 40 (cuDNN
masked 3.95 ms vs unmasked 2.85 ms, fwd + bwd, bench/results/pi05_h200.md), and packing also skips
the padded keys (~23% of the prefix with Pi0.5's 200-token prompt). `bench/kernels/bench_kernels_gpu.py`
times this against the masked path, cuDNN's ragged attention and native GQA (not yet run on a GPU).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # torch >= 2.9; parallel/attention.py refuses the switch on CUDA without it
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None


def pack_keys(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For `keep` (S, T) bool: `dest` (S*T,) the packed row of every flattened key (valid keys of
    segment s at rows cu[s]..cu[s+1], in order, then all padding keys), `cu` (S+1,) int32, and
    `used` (S*T,) bool: the packed row belongs to a segment."""
    flat = keep.reshape(-1)
    n_valid = flat.sum()
    dest = torch.where(flat, flat.cumsum(0) - 1, n_valid + (~flat).cumsum(0) - 1)
    cu = F.pad(keep.sum(1).cumsum(0), (1, 0)).to(torch.int32)
    used = torch.arange(flat.numel(), device=keep.device) < n_valid
    return dest, cu, used


def varlen_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                  max_q: int, max_k: int) -> torch.Tensor:
    """Bidirectional attention of packed q (Nq, 1, hd) over packed k, v (Nk, 1, hd), segment by
    segment. CUDA: FlashAttention-2 varlen. CPU (tests, tiny runs): SDPA with a segment mask built
    from the same offsets, dense, so only the CUDA path is mask-free."""
    if q.is_cuda:
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k)
    seg_q = torch.searchsorted(cu_q, torch.arange(q.shape[0], device=q.device), right=True)
    seg_k = torch.searchsorted(cu_k, torch.arange(k.shape[0], device=k.device), right=True)
    mask = seg_q[:, None] == seg_k[None, :]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
    return out.transpose(0, 1)


def varlen_grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_keep: torch.Tensor) -> torch.Tensor:
    """`layers.grouped_attention` with `key_keep` (B, Tk) applied by packing, not by a mask.
    Token-major q (B, Tq, Hq, hd), k/v (B, Tk, Hkv, hd); returns (B, Tq, Hq * hd)."""
    b, tq, hq, hd = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    # one segment per (sample, K/V head); with Hkv = 1 every reshape here is a view
    qs = q.reshape(b, tq, hkv, g, hd).transpose(1, 2).reshape(b * hkv * tq * g, 1, hd)
    ks, vs = (x.transpose(1, 2).reshape(b * hkv * tk, 1, hd) for x in (k, v))
    keep = key_keep.repeat_interleave(hkv, dim=0) if hkv > 1 else key_keep
    dest, cu_k, used = pack_keys(keep)
    used = used[:, None, None]
    kp, vp = (torch.where(used, torch.zeros_like(x).index_copy(0, dest, x), 0) for x in (ks, vs))
    cu_q = torch.arange(0, b * hkv + 1, device=q.device, dtype=torch.int32) * (tq * g)
    out = varlen_kernel(qs.contiguous(), kp, vp, cu_q, cu_k, tq * g, tk)
    return out.reshape(b, hkv, tq, g, hd).transpose(1, 2).reshape(b, tq, hq * hd)


def varlen_prefix_suffix_attention(
    qp: torch.Tensor | None, kp: torch.Tensor, vp: torch.Tensor,
    qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
    prefix_keep: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """`layers.prefix_suffix_attention` (same arguments, same function) with packed keys and the
    varlen kernel instead of key-padding masks. `prefix_keep` None: nothing to pack, so it is the
    plain two-call SDPA (flash path)."""
    if prefix_keep is None:
        from trainkit.models.layers import prefix_suffix_attention
        return prefix_suffix_attention(qp, kp, vp, qs, ks, vs, None)
    keep_s = torch.cat([prefix_keep, torch.ones(qs.shape[0], qs.shape[1], dtype=torch.bool, device=qs.device)], 1)
    out_p = None if qp is None else varlen_grouped_attention(qp, kp, vp, prefix_keep)
    out_s = varlen_grouped_attention(qs, torch.cat([kp, ks], 1), torch.cat([vp, vs], 1), keep_s)
    return out_p, out_s

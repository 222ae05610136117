"""Rotary positions of the `dreamzero` sequence: Wan's 3-D RoPE for video tokens and DreamZero's
1-D RoPE for action and state tokens.

Video: the head dim's rotation pairs are split over (frame, row, column) as Wan splits them, d -
4 floor(d/6), 2 floor(d/6), 2 floor(d/6) channels (theta 1e4 each, over its own sub-dim); a noisy
latent frame has the position of its clean copy. Actions and states: one 1-D RoPE over the whole
head dim, position = the token's index over all blocks (block i's actions from i x
actions_per_block: the per-block offsets). Pairs are adjacent channels (2j, 2j + 1), as Wan's
complex view and diffusers' `repeat_interleave_real`. Tables are float64-built, applied in float32.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from trainkit.models.dreamzero.sequence import TokenSequence


def _inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def video_split(head_dim: int) -> tuple[int, int, int]:
    """(frame, row, column) channels of the head dim (Wan: d - 4 floor(d/6), 2 floor(d/6), 2 floor(d/6))."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_angles(seq: TokenSequence, grid: tuple[int, int, int], head_dim: int, theta: float) -> torch.Tensor:
    """(T, head_dim / 2) float64 rotation angles of every token of `seq` (grid: latent frames, rows, cols)."""
    f, h, w = grid
    dt, dh, dw = video_split(head_dim)
    frame = torch.arange(f, dtype=torch.float64)[:, None] * _inv_freq(dt, theta)
    row = torch.arange(h, dtype=torch.float64)[:, None] * _inv_freq(dh, theta)
    col = torch.arange(w, dtype=torch.float64)[:, None] * _inv_freq(dw, theta)
    video = torch.cat([frame[:, None, None].expand(f, h, w, -1), row[None, :, None].expand(f, h, w, -1),
                       col[None, None, :].expand(f, h, w, -1)], dim=-1).reshape(f, h * w, -1)
    inv = _inv_freq(head_dim, theta)
    parts = []
    for kind, start, count in seq.pieces:
        if kind == "video":
            parts.append(video[start:start + count].flatten(0, 1))
        else:
            parts.append(torch.arange(start, start + count, dtype=torch.float64)[:, None] * inv)
    return torch.cat(parts)


def rope_tables(seq: TokenSequence, grid: tuple[int, int, int], head_dim: int, theta: float,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (T, head_dim / 2) float32 on `device`, built once per sequence and device: the
    host-built tables' copy to the GPU is a host sync a step, and inside a CUDA graph's capture a
    refused copy (the first, eager warm-up call fills the cache before the capture)."""
    return _rope_tables(seq, tuple(grid), head_dim, float(theta), str(torch.device(device)))


@lru_cache(maxsize=16)
def _rope_tables(seq: TokenSequence, grid: tuple[int, int, int], head_dim: int, theta: float,
                 device: str) -> tuple[torch.Tensor, torch.Tensor]:
    angles = rope_angles(seq, grid, head_dim, theta)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, hd) rotated pairwise by the tables (T, hd / 2); float32 math, x's dtype out."""
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[:, None], sin[:, None]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2).to(x.dtype)

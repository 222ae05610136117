"""Qwen3-VL's rotary positions: the LLM's interleaved 3-D mRoPE and the ViT's 2-D RoPE.

LLM positions (`mrope_positions`) follow transformers' `Qwen3VLModel.get_rope_index`, which
LeRobot 0.6.1 feeds as its 4-row "legacy" ids (a copy of the temporal row first, used only to
build the causal mask, so it changes nothing here): over a sample's valid (unpadded) tokens, text
tokens count up on all three axes (t, h, w); an image of gh x gw merged tokens starting at position
p takes t = p, h = p + row, w = p + col, and the text after it resumes at p + max(gh, gw). Padding
gets 0 on every axis. Here that is closed form (cumulative sums, no Python loop over samples or
images), since every image of a batch has the same grid: a text token's position is its valid
index, less the image tokens before it, plus max(gh, gw) per image before it.

`mrope_tables` interleaves the three axes over the rotary frequencies as Qwen3-VL does
(`apply_interleaved_mrope`): frequency j rotates by h if j % 3 == 1 and j < 3 x section_h, by w if
j % 3 == 2 and j < 3 x section_w, else by t. Tables are (B, T, 1, head_dim / 2) for
`trainkit.models.layers.apply_rope`, whose split-half rotation is transformers' `rotate_half`.
"""
from __future__ import annotations

import torch


def inverse_frequencies(dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """(dim / 2,) fp32 rotary frequencies, computed as transformers does (bit-equal tables)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


def mrope_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, image_token_id: int,
                    merged_grid: tuple[int, int]) -> torch.Tensor:
    """(3, B, T) int64 (t, h, w) positions of left- or right-padded `input_ids` (B, T) whose images
    are runs of gh x gw `image_token_id` tokens (`attention_mask` (B, T) bool: real tokens)."""
    gh, gw = merged_grid
    per_image = gh * gw
    valid = attention_mask.bool()
    is_image = (input_ids == image_token_id) & valid
    k = valid.long().cumsum(dim=1) - 1                      # index among the sample's valid tokens
    images_before = is_image.long().cumsum(dim=1) - is_image.long()  # image tokens strictly before
    image_index, offset = images_before // per_image, images_before % per_image
    # a text token: valid tokens before it, less the image tokens, plus max(gh, gw) per image; an
    # image token: the same count less its offset in the image, which is its image's start p
    pos = k - images_before + image_index * max(gh, gw)
    h = torch.where(is_image, pos + offset // gw, pos)
    w = torch.where(is_image, pos + offset % gw, pos)
    return torch.stack([pos, h, w]).masked_fill(~valid, 0)


def mrope_axes(half: int, section: tuple[int, int, int], device: torch.device | None = None) -> torch.Tensor:
    """(half,) int64: the axis (0 t, 1 h, 2 w) each rotary frequency follows, interleaved."""
    axis = torch.zeros(half, dtype=torch.int64, device=device)
    axis[1: 3 * section[1]: 3] = 1
    axis[2: 3 * section[2]: 3] = 2
    return axis


def mrope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                 section: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (B, T, 1, head_dim / 2) fp32 of (3, B, T) positions, axes interleaved by `section`."""
    half = head_dim // 2
    inv_freq = inverse_frequencies(head_dim, theta, positions.device)
    axis = mrope_axes(half, section, positions.device)
    angles = positions.float().permute(1, 2, 0)[..., axis] * inv_freq  # (B, T, half)
    return angles.cos()[:, :, None], angles.sin()[:, :, None]


def vision_rope_tables(grid: tuple[int, int], head_dim: int, device: torch.device | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (1, rows x cols, 1, head_dim / 2) fp32 of the ViT's 2-D RoPE over a row-major patch
    grid: the first half of the frequencies rotate by the patch row, the second by its column
    (theta 10000 over head_dim / 2 channels, as Qwen3-VL's `rot_pos_emb`)."""
    rows, cols = grid
    inv_freq = inverse_frequencies(head_dim // 2, 10_000.0, device)
    r = torch.arange(rows, device=device, dtype=torch.float32).repeat_interleave(cols)
    c = torch.arange(cols, device=device, dtype=torch.float32).repeat(rows)
    angles = torch.cat([torch.outer(r, inv_freq), torch.outer(c, inv_freq)], dim=-1)
    return angles.cos()[None, :, None], angles.sin()[None, :, None]

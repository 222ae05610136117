"""Qwen3-VL's vision tower (the ViT of Cosmos-Reason2-2B / GR00T N1.7) over a batch of same-size views.

Per view (N, 3, H, W), normalised: patch embedding, the learned position table interpolated to
the patch grid, `depth` pre-LayerNorm blocks (bidirectional attention with 2-D RoPE, GELU-tanh
MLP), then the 2x2 merger: LayerNorm per patch, each 2x2 neighbourhood's four patches concatenated
(row by row), Linear -> GELU -> Linear to the LLM width. Deepstack: after each block named in
`cfg.deepstack` an extra merger (its LayerNorm over the concatenated 4 x width, after the merge)
makes one more set of image tokens, added later into LLM layers 0, 1, 2.

Differences of form from transformers' `Qwen3VLVisionModel`, none of value (the parity test in
tests/trainkit/models/gr00t/test_gr00t_backbone_oracle.py holds them to float32 precision):
- an image is a still frame, so the Conv3d over `temporal_patch` copies of it equals a Conv2d
  with the kernel summed over time (half the patch-embedding FLOPs, no frame copies);
- tokens stay in row-major patch order through the blocks (attention does not care about order,
  the RoPE and position tables follow the patch) and are grouped 2x2 only for the mergers, where
  transformers orders the whole sequence block-wise from the processor on;
- views are a batch dimension for `F.scaled_dot_product_attention`, not a packed sequence split
  by `cu_seqlens`.
Parameter names are transformers' (`patch_embed.proj`, `pos_embed`, `blocks.i.attn.qkv`,
`merger.linear_fc1`, `deepstack_merger_list.i`...), so a checkpoint loads by prefix.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainkit.models.gr00t.qwen3_vl.mrope import vision_rope_tables
from trainkit.models.gr00t.qwen3_vl.config import Qwen3VLConfig
from trainkit.models.layers import apply_rope


class PatchEmbed(nn.Module):
    """Conv3d (width, 3, temporal_patch, patch, patch) of a still frame, applied as a Conv2d with the
    kernel summed over time. The sum and the convolution run in float32 (a bf16 sum of the two
    kernel halves would round where the Conv3d accumulates in float32); the output takes the
    weight's dtype."""

    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.patch = cfg.patch
        self.proj = nn.Conv3d(3, cfg.vision_width, (cfg.temporal_patch, cfg.patch, cfg.patch),
                              stride=(cfg.temporal_patch, cfg.patch, cfg.patch))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, H/p x W/p, width), row-major patches."""
        w, b = self.proj.weight, self.proj.bias
        x = F.conv2d(images.float(), w.float().sum(dim=2), b.float(), stride=self.patch)
        return x.flatten(2).transpose(1, 2).to(w.dtype)


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, hidden)
        self.linear_fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention over one view's patches, q and k rotated by the 2-D RoPE."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, p, d = x.shape
        q, k, v = self.qkv(x).view(n, p, 3, self.heads, d // self.heads).unbind(2)
        q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(n, p, d))


class VisionBlock(nn.Module):
    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.vision_width, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.vision_width, eps=1e-6)
        self.attn = VisionAttention(cfg.vision_width, cfg.vision_heads)
        self.mlp = VisionMLP(cfg.vision_width, cfg.vision_mlp)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


def merge_patches(x: torch.Tensor, grid: tuple[int, int], merge: int) -> torch.Tensor:
    """(N, rows x cols, D) row-major patches -> (N, rows/m x cols/m, m x m x D): each m x m
    neighbourhood one token (row-major), its patches' channels concatenated row by row."""
    n, _, d = x.shape
    rows, cols = grid
    x = x.view(n, rows // merge, merge, cols // merge, merge, d).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (rows // merge) * (cols // merge), merge * merge * d)


class Merger(nn.Module):
    """LayerNorm, then merge x merge patches -> Linear -> GELU -> Linear to the LLM width. The
    main merger normalises each patch before the merge; the deepstack mergers (`after_merge`)
    normalise the concatenated vector."""

    def __init__(self, cfg: Qwen3VLConfig, *, after_merge: bool):
        super().__init__()
        merged = cfg.vision_width * cfg.merge ** 2
        self.after_merge = after_merge
        self.norm = nn.LayerNorm(merged if after_merge else cfg.vision_width, eps=1e-6)
        self.linear_fc1 = nn.Linear(merged, merged)
        self.linear_fc2 = nn.Linear(merged, cfg.hidden)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], merge: int) -> torch.Tensor:
        x = self.norm(merge_patches(x, grid, merge)) if self.after_merge else merge_patches(self.norm(x), grid, merge)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(nn.Module):
    """Views -> (image tokens (N, tokens_per_image, hidden), [deepstack tokens, same shape, per deepstack block])."""

    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.position_table, cfg.vision_width)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.vision_depth))
        self.merger = Merger(cfg, after_merge=False)
        self.deepstack_merger_list = nn.ModuleList(Merger(cfg, after_merge=True) for _ in cfg.deepstack)

    def positions(self, grid: tuple[int, int]) -> torch.Tensor:
        """(rows x cols, width): the square position table bilinearly resampled to the patch grid,
        corners on corners (transformers' `fast_pos_embed_interpolate`, the same four weighted rows
        summed in the same order)."""
        side = round(self.cfg.position_table ** 0.5)
        table = self.pos_embed.weight
        axes = []
        for n in grid:
            at = torch.linspace(0, side - 1, n, device=table.device)
            lo = at.int()
            axes.append((lo.long(), (lo + 1).clamp(max=side - 1).long(), at - lo))
        (r0, r1, dr), (c0, c1, dc) = axes
        out = None
        for rows, wr in ((r0, 1 - dr), (r1, dr)):
            for cols, wc in ((c0, 1 - dc), (c1, dc)):
                weight = (wr[:, None] * wc[None, :]).flatten()[:, None].to(table.dtype)
                term = table[(rows[:, None] * side + cols[None, :]).flatten()] * weight
                out = term if out is None else out + term
        return out

    def forward(self, images: torch.Tensor, blocks: Sequence[nn.Module] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`blocks`: the ViT blocks to run (None: this tower's own; GR00T's model passes its root block list)."""
        cfg = self.cfg
        grid = (images.shape[-2] // cfg.patch, images.shape[-1] // cfg.patch)
        x = self.patch_embed(images) + self.positions(grid)
        cos, sin = vision_rope_tables(grid, cfg.vision_width // cfg.vision_heads, x.device)
        deep = []
        for i, block in enumerate(self.blocks if blocks is None else blocks):
            x = block(x, cos, sin)
            if i in cfg.deepstack:
                deep.append(self.deepstack_merger_list[cfg.deepstack.index(i)](x, grid, cfg.merge))
        return self.merger(x, grid, cfg.merge), deep

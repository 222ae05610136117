"""Camera views tiled into one canvas per frame, for models that take a single image (DreamZero).

`LoaderConfig.tile = "wrist_top"` with three slots (wrist, exterior 1, exterior 2), each H x W (cameras
stored at different sizes are first resized to one, `LoaderConfig.resize`: DreamZero resizes each
view to its cell; without it the normaliser refuses to tile them):

    +---------------------------+
    |  slot 0, widened to 2W    |   rows 0 .. H-1: each wrist column twice (nearest, exact)
    +-------------+-------------+
    |   slot 1    |   slot 2    |   rows H .. 2H-1
    +-------------+-------------+

so 3 views at 176x320 become one 352x640 canvas (DreamZero's DROID canvas). Tiling runs inside the
normaliser, on the device, after the uint8 copy: the host sends the 3 views (3/4 of the canvas's
bytes) and the canvas is built there, one pass, before scaling. A slot without a camera is black
(its `image_mask` entry False) and keeps its place, so tiling needs `prune_slots=False`.
"""
from __future__ import annotations

import torch

TILE_MODES = ("wrist_top",)
TILE_SLOTS = {"wrist_top": 3}


def tiled_shape(mode: str, height: int, width: int) -> tuple[int, int]:
    """(H, W) of the canvas of `mode` from views of `height` x `width`."""
    if mode == "wrist_top":
        return 2 * height, 2 * width
    raise ValueError(f"tile={mode!r} is not one of {', '.join(TILE_MODES)}")


def tile_views(x: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, K, T, C, H, W) views of any dtype -> (B, 1, T, C, H', W') canvases (`tiled_shape`)."""
    if mode != "wrist_top":
        raise ValueError(f"tile={mode!r} is not one of {', '.join(TILE_MODES)}")
    if x.shape[1] != 3:
        raise ValueError(f"tile='wrist_top' needs 3 slots (wrist, exterior, exterior), got {x.shape[1]}")
    top = x[:, 0].repeat_interleave(2, dim=-1)  # (B, T, C, H, 2W): the wrist view widened
    bottom = torch.cat([x[:, 1], x[:, 2]], dim=-1)
    return torch.cat([top, bottom], dim=-2).unsqueeze(1)

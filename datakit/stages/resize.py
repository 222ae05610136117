"""Antialiased resize of uint8 frame batches to the training size (torch's uint8 CPU kernel)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def parse_size(text: str) -> tuple[int, int]:
    """'224x224' -> (224, 224) as (height, width)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--resize expects HxW, e.g. 224x224, got {text!r}") from None
    if h <= 0 or w <= 0:
        raise ValueError(f"--resize sizes must be positive, got {text!r}")
    return h, w


def resize_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, h, w, 3) uint8, bilinear with antialiasing (area-like when shrinking)."""
    if frames.shape[1:3] == tuple(size):
        return frames
    t = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # channels-last NCHW view
    out = F.interpolate(t, size=size, mode="bilinear", antialias=True, align_corners=False)
    return out.permute(0, 2, 3, 1).contiguous().numpy()

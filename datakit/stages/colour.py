"""RGB <-> NV12 (full-range BT.601) in torch, so the same code runs on the CPU and the GPU.

NV12 stores a full-resolution Y plane followed by interleaved U/V at half resolution:
1.5 bytes per pixel instead of 3. Frames are (N, H*3//2, W) uint8; H and W must be even.
"""
from __future__ import annotations

import numpy as np
import torch

# rows: Y, U, V from R, G, B (full range, JPEG / BT.601)
_RGB_TO_YUV = torch.tensor(
    [[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]]
)


def rgb_to_nv12(rgb: torch.Tensor) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB -> (N, H*3//2, W) uint8 NV12 (chroma averaged over 2x2)."""
    n, h, w, _ = rgb.shape
    if h % 2 or w % 2:
        raise ValueError(f"NV12 needs an even height and width, got {h}x{w}")
    x = rgb.to(torch.float32)
    yuv = x @ _RGB_TO_YUV.to(x.device).T  # (N, H, W, 3)
    y = yuv[..., 0]
    uv = yuv[..., 1:].reshape(n, h // 2, 2, w // 2, 2, 2).mean(dim=(2, 4)) + 128.0  # (N,H/2,W/2,2)
    out = torch.empty((n, h * 3 // 2, w), dtype=torch.uint8, device=rgb.device)
    out[:, :h] = y.round().clamp_(0, 255).to(torch.uint8)
    out[:, h:] = uv.reshape(n, h // 2, w).round().clamp_(0, 255).to(torch.uint8)
    return out


def nv12_to_rgb_float(nv12: torch.Tensor) -> torch.Tensor:
    """(N, H*3//2, W) uint8 NV12 -> (N, 3, H, W) float32 RGB in [0, 255] (channel-first, for models)."""
    n, h3, w = nv12.shape
    h = h3 * 2 // 3
    y = nv12[:, :h].to(torch.float32)
    uv = nv12[:, h:].reshape(n, h // 2, w // 2, 2).to(torch.float32) - 128.0
    uv = uv.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)  # nearest upsampling
    u, v = uv[..., 0], uv[..., 1]
    r = y + 1.402 * v
    g = y - 0.344136 * u - 0.714136 * v
    b = y + 1.772 * u
    return torch.stack((r, g, b), dim=1).clamp_(0.0, 255.0)


def nv12_to_rgb(nv12: torch.Tensor) -> torch.Tensor:
    """(N, H*3//2, W) uint8 NV12 -> (N, H, W, 3) uint8 RGB."""
    return nv12_to_rgb_float(nv12).round_().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def stored_shape(layout: str, height: int, width: int) -> tuple[int, ...]:
    """Shape of one stored frame for a colour layout."""
    if layout == "rgb":
        return (height, width, 3)
    if layout == "nv12":
        return (height * 3 // 2, width)
    raise ValueError(f"unknown layout {layout!r} (supported: rgb, nv12)")



def blank_frames(frames: np.ndarray, where: tuple, layout: str) -> None:
    """Black frames at `where` of `frames` (..., frame bytes), each frame flattened on the last axis:
    zeros in rgb; in nv12 the luma (the first 2/3 of the bytes) 0 and the chroma 128, since zero
    chroma decodes to green (RGB 0/135/0). What a missing camera or frame reads as."""
    if layout != "nv12":
        frames[where] = 0
        return
    luma = frames.shape[-1] * 2 // 3
    frames[(*where, Ellipsis, slice(0, luma))] = 0
    frames[(*where, Ellipsis, slice(luma, None))] = 128


def black_frame(shape: tuple[int, ...], layout: str) -> np.ndarray:
    """One black frame of the stored `shape` (`blank_frames`' bytes)."""
    out = np.empty(int(np.prod(shape)), np.uint8)
    blank_frames(out, (), layout)
    return out.reshape(shape)

"""The device resize of a camera view to the model's input size, in the two ways models ask for it.

- "stretch": bilinear with antialias straight to (H, W), the aspect ratio not kept; what DreamZero
  (each view to its canvas cell) and GR00T with `view_transform = "resize"` train with here.
- "bicubic": bicubic with antialias straight to (H, W), each value clamped to [0, 255] and rounded
  to a whole level: torchvision's `resize` of a uint8 frame on the GPU (float kernel, clamp, round),
  which GR00T N1.7's view transform runs in LeRobot 0.6.1 (`_transform_n1_7_image_for_vlm_torch`:
  256 x 256, centre crop 230, back to 256 x 256; LoaderConfig.crop_resize). On the CPU torchvision
  takes a fixed-point uint8 kernel instead, within one level of this.
- "pad": the aspect-preserving resize-with-pad of LeRobot 0.6.1's and openpi's Pi0.5
  (`lerobot/policies/common/vla_utils.py::resize_with_pad_torch`, "an exact copy" of openpi's):
  scale by 1 / max(w / W, h / H), sizes truncated (`int`), bilinear, `align_corners=False`, no
  antialias, clamped to the value range, then padded with black (0) centred, the odd pixel going
  to the bottom / right. LeRobot runs it on floats in [0, 1]; here it runs on [0, 255] before the
  scale to the model's range, the same resize of the same pixels (clamp and pad value scale along).

Both take (N, C, h, w) uint8 or float and return float (N, C, H, W) in [0, 255]; a view already
at (H, W) is returned as it is (LeRobot skips it too).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

RESIZE_MODES = ("stretch", "bicubic", "pad")


def resize_view(x: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """`x` resized to `size` = (H, W) the way `mode` says ("stretch" or "pad")."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    if mode == "stretch":
        return F.interpolate(x.float(), size=size, mode="bilinear", align_corners=False, antialias=True)
    if mode == "bicubic":
        y = F.interpolate(x.float(), size=size, mode="bicubic", align_corners=False, antialias=True)
        return y.clamp_(0.0, 255.0).round_()
    if mode == "pad":
        return resize_with_pad(x, size)
    raise ValueError(f"resize_mode={mode!r} is not one of {', '.join(RESIZE_MODES)}")


def pad_geometry(h: int, w: int, size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """(resized (h', w'), padding (left, right, top, bottom)) of an h x w view padded into `size`."""
    height, width = size
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    top, odd_h = divmod(height - rh, 2)
    left, odd_w = divmod(width - rw, 2)
    return (rh, rw), (left, left + odd_w, top, top + odd_h)


def resize_with_pad(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """LeRobot's / openpi's Pi0.5 resize-with-pad (module docstring) of (N, C, h, w) values in [0, 255]."""
    inner, pad = pad_geometry(*x.shape[-2:], size)
    y = F.interpolate(x.float(), size=inner, mode="bilinear", align_corners=False).clamp_(0.0, 255.0)
    return F.pad(y, pad, mode="constant", value=0.0)

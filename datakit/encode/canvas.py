"""A clip of several cameras as the loader's tiled canvas (`datakit encode --slots A,B,C --tile
wrist_top`): what the DreamZero family trains on from frame shards, encoded once.

The canvas is the loader's by construction, not a second implementation of it: the slots' stored
bytes are read as the loader reads them (`ShardReader.read_raw`; a frame the camera lacks, as in an
episode where it is missing, is black, as `ShardDataset.frame_plan` writes it; a blank camera's
stored constant frame as stored), then the loader's own device transform builds the canvas
(`Normaliser`: nv12 -> RGB, each view stretched to its cell from its own stored size with
`loader/resize.py`, tiled with `loader/tiling.py`, scaled to [-1, 1] by image_mean = image_std =
0.5, in float32): the canvas the trainer's float32 image path gets from the same frames, bit for bit.
So a slot without a real camera keeps its place as the loader's does (missing: black in either
layout, `datakit.stages.colour.black_frame`); only an episode with no real slot at all
gives no clip (`clips.py`), as for one camera.
"""
from __future__ import annotations

import numpy as np
import torch

from datakit.encode.clips import Clip
from datakit.errors import ConfigError
from datakit.loader.config import LoaderConfig
from datakit.loader.normalise import Normaliser
from datakit.loader.slots import IMAGES, view_sizes
from datakit.loader.tiling import tiled_shape
from datakit.reader import ShardReader
from datakit.shards.index import ShardIndex


def resolve_slots(index: ShardIndex, slots: tuple[str, ...], tile: str) -> tuple[str, ...]:
    """The canvas's cameras: `slots`, or the index's cameras when none are named (the loader's rule)."""
    cams = slots or tuple(index.cameras)
    unknown = [c for c in cams if c not in index.cameras]
    if unknown:
        raise ConfigError("--slots", f"{', '.join(unknown)}: not a camera of the source (have: "
                                     f"{', '.join(index.cameras)})")
    if not slots and len(cams) != 3:
        raise ConfigError("--slots", f"--tile {tile} takes 3 views; the source has {len(cams)} cameras "
                                     f"({', '.join(cams)}): name them in canvas order")
    return cams


def canvas_size(index: ShardIndex, slots: tuple[str, ...], tile: str, size: tuple[int, int] | None) -> tuple[int, int]:
    """(H, W) of the canvas: `size`, or the tiling of the views' stored size when they share one."""
    if size is not None:
        return tuple(size)
    stored = set(view_sizes(index, slots).values())
    if len(stored) != 1:
        sizes = ", ".join(f"{h}x{w}" for h, w in sorted(stored))
        raise ConfigError("--size", f"the slots' cameras are stored at different sizes ({sizes}): give the "
                                    "canvas size, each view is stretched to half of it")
    return tiled_shape(tile, *stored.pop())


def canvas_normaliser(index: ShardIndex, slots: tuple[str, ...], tile: str, cell: tuple[int, int] | None,
                      device: str | torch.device) -> Normaliser:
    """The loader's device transform for this canvas: `cell` the stretch size of every view (None:
    stored), float32 output in [-1, 1]."""
    cfg = LoaderConfig(slots=slots, tile=tile, prune_slots=False, resize=cell, resize_mode="stretch",
                       image_dtype="float32", image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    return Normaliser.from_index(index, cfg).to(device)


def read_views(reader: ShardReader, slots: tuple[str, ...], clips: list[Clip], frames: int,
               stride: int) -> list[torch.Tensor]:
    """Per slot, (N, T, *stored frame shape) uint8: the clips' frames at `stride` as stored."""
    views = []
    for cam in slots:
        views.append(torch.from_numpy(np.stack([np.stack([reader.read_raw(c.row + k * stride, cam)
                                                          for k in range(frames)]) for c in clips])))
    return views


def tiled_clips(norm: Normaliser, views: list[torch.Tensor]) -> torch.Tensor:
    """(N, 3, T, H, W) float32 canvases in [-1, 1] from the slots' stored views, through the
    loader's normaliser as the loader batches them: one stacked tensor when every slot stores one
    frame shape, one tensor per slot otherwise."""
    device = norm.image_scale.device
    views = [v.to(device) for v in views]
    if len({tuple(v.shape[2:]) for v in views}) == 1:
        x = norm.images(torch.stack(views, dim=1))
    else:
        x = norm.slot_views(views)[IMAGES]
    return x[:, 0].permute(0, 2, 1, 3, 4).contiguous()


def canvas_frame_u8(x: torch.Tensor) -> np.ndarray:
    """(3, H, W) canvas frame in [-1, 1] -> (H, W, 3) uint8 (rounded), what CLIP's processor takes."""
    return ((x.float() + 1.0) * 127.5).round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()

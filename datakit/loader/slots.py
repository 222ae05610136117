"""Camera slots: map dataset cameras onto a model's fixed image slots and prune empty ones.

Conversion records, per episode and camera, whether the video is real, blank (a constant
frame, e.g. a padded camera) or missing. A model with three slots fed a dataset with two
real cameras would otherwise encode and attend over a black image in every sample. Per
batch we keep only slots that at least one sample fills with a real camera and return an
image mask (B, kept) saying which samples fill which kept slot; pruned slots are not even
read from disk.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datakit.loader.tiling import TILE_SLOTS
from datakit.shards.index import STATUS_REAL, ShardIndex


@dataclass(frozen=True)
class SlotMap:
    """The model's slots, the camera behind each (None: never filled) and who fills them."""

    names: tuple[str, ...]  # one name per slot: the camera, or "empty_<i>" for None
    cameras: tuple[str | None, ...]  # dataset camera per slot
    real: np.ndarray  # (E, S) bool: episode e has a real video for slot s


def slot_map(index: ShardIndex, slots: tuple[str | None, ...], tile: str | None = None) -> SlotMap:
    """Resolve a config's `slots` against the index (empty: every camera, index order); with `tile`,
    the slots must be as many as the canvas takes."""
    cams = tuple(slots) if slots else tuple(index.cameras)
    unknown = [c for c in cams if c is not None and c not in index.cameras]
    if unknown:
        raise ValueError(f"slots name unknown cameras {unknown}; the index has {list(index.cameras)}")
    if not cams:
        raise ValueError("no camera slots: the index has no cameras and `slots` is empty")
    if tile is not None and len(cams) != TILE_SLOTS[tile]:
        raise ValueError(f"tile={tile!r} takes {TILE_SLOTS[tile]} views; slots is empty and the index has "
                         f"{len(cams)} cameras {list(cams)}: name the views in slots")
    real = np.zeros((len(index.episodes), len(cams)), bool)
    for e, ep in enumerate(index.episodes):
        for s, cam in enumerate(cams):
            real[e, s] = cam is not None and ep.camera_status.get(cam) == STATUS_REAL
    names = tuple(c if c is not None else f"empty_{i}" for i, c in enumerate(cams))
    return SlotMap(names=names, cameras=cams, real=real)


def kept_slots(real: np.ndarray, prune: bool) -> np.ndarray:
    """Indices of the slots a batch keeps, given its (B, S) `real` matrix.

    With pruning, a slot stays if any sample fills it; at least one slot always stays so the
    image tensor keeps its rank (a batch of samples with no real camera at all).
    """
    s = real.shape[1]
    if not prune:
        return np.arange(s)
    keep = np.flatnonzero(real.any(axis=0))
    return keep if keep.size else np.arange(min(s, 1))

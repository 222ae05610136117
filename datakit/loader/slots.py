"""Camera slots: map dataset cameras onto a model's fixed image slots and prune empty ones.

Conversion records, per episode and camera, whether the video is real, blank (a constant
frame, e.g. a padded camera) or missing. A model with three slots fed a dataset with two
real cameras would otherwise encode and attend over a black image in every sample. Per
batch we keep only slots that at least one sample fills with a real camera and return an
image mask (B, kept) saying which samples fill which kept slot; pruned slots are not even
read from disk.

How a batch carries the kept slots' frames: when every slot camera stores one frame shape, one
tensor `images` (B, K, T, *frame_shape), as always; when the cameras differ in size (a 96x128
wrist camera beside a 120x160 scene camera), one tensor per kept slot, `images.<j>` (B, T,
*frame_shape_j) for the j-th kept slot, each at its camera's stored size. `slot_images` reads
either form; the device normaliser resizes the views to the model's input and stacks them again.
A mixture whose sources store one slot's cameras at different sizes splits that slot by size:
`images.<j>.<g>` (n_g, T, *frame_shape_g) holds the items of size group g, `image_items.<j>.<g>`
(n_g,) int64 says which batch items they are (`slot_groups` reads every form); the normaliser
resizes each group and writes it to its items' places.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

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


def slot_frame_shapes(index: ShardIndex, cameras: tuple[str | None, ...]) -> tuple[tuple[int, ...], ...]:
    """The stored frame shape of each slot's camera; a slot without a camera (zeros, masked) takes the
    smallest of them, so it costs the fewest bytes (and the common one when they agree)."""
    shapes = {c: tuple(index.cameras[c].frame_shape) for c in cameras if c is not None}
    empty = min(shapes.values(), key=lambda s: (int(np.prod(s)), s)) if shapes else (1,)
    return tuple(shapes[c] if c is not None else empty for c in cameras)


def view_sizes(index: ShardIndex, slots: tuple[str | None, ...] = ()) -> dict[str, tuple[int, int]]:
    """(height, width) of the RGB view of each slot camera (`slots` empty: every index camera), as
    stored: what a model's device resize starts from. nv12 frames hold 3/2 rows per view row."""
    cams = [c for c in (slots or tuple(index.cameras)) if c is not None]
    out = {}
    for cam in cams:
        rows, cols = index.cameras[cam].frame_shape[:2]
        out[cam] = (rows * 2 // 3, cols) if index.layout == "nv12" else (rows, cols)
    return out


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


IMAGES = "images"  # the stacked images tensor (B, K, T, *frame_shape)


def slot_key(j: int) -> str:
    """The key of the j-th kept slot's own images tensor (cameras of different sizes)."""
    return f"{IMAGES}.{j}"


def is_slot_key(key: str) -> bool:
    return key.startswith(IMAGES + ".")


ITEMS = "image_items"  # a size group's batch items (a mixture's slot whose sources differ in size)


def group_key(j: int, g: int) -> str:
    """The key of size group `g` of the j-th kept slot (its items: `items_key(j, g)`)."""
    return f"{slot_key(j)}.{g}"


def items_key(j: int, g: int) -> str:
    return f"{ITEMS}.{j}.{g}"


def is_items_key(key: str) -> bool:
    return key.startswith(ITEMS + ".")


SlotGroups = list[tuple[torch.Tensor, torch.Tensor | None]]  # (frames, their batch items; None: all)


def slot_groups(batch: Mapping[str, torch.Tensor]) -> list[SlotGroups]:
    """Per kept slot, in `slot_index` order, its frames as groups of one stored size: [(frames (B, T,
    *frame_shape), None)] for a slot of one size (stacked or `images.<j>`), else [(frames (n_g, T,
    *frame_shape_g), items (n_g,)), ...] for a mixture's slot split by size. Views, no copy."""
    if IMAGES in batch:
        return [[(v, None)] for v in batch[IMAGES].unbind(1)]
    found: dict[int, dict[int, torch.Tensor | None]] = {}
    for key in batch:
        if is_slot_key(key):
            parts = key.split(".")
            found.setdefault(int(parts[1]), {})[int(parts[2]) if len(parts) > 2 else -1] = batch[key]
    out = []
    for j in range(len(found)):
        groups = found[j]
        out.append([(groups[-1], None)] if -1 in groups else
                   [(groups[g], batch[items_key(j, g)]) for g in sorted(groups)])
    return out


def slot_images(batch: Mapping[str, torch.Tensor], *, batched: bool = True) -> list[torch.Tensor]:
    """The frames of each kept slot, in `slot_index` order: (B, T, *frame_shape_j) each, whether the
    batch stacks them (`images`) or carries one tensor per slot (`images.<j>`). `batched=False`: a
    single sample (`ShardDataset[i]`), (T, *frame_shape_j) each. Views, no copy. A mixture's slot
    split by size has no such tensor: `slot_groups` reads it."""
    if IMAGES in batch:
        return list(batch[IMAGES].unbind(1 if batched else 0))
    out = []
    while slot_key(len(out)) in batch:
        out.append(batch[slot_key(len(out))])
    return out

"""`MixtureDataset`: a batch of global sample positions read from several shard folders into one buffer.

Each source is a plain `ShardDataset` (its own index, statistics, cameras, windows at its own fps);
the mixture's schedule (`mixture.SourceOrders`) maps a global position to (source, anchor). A batch
is one buffer, as for one folder: each source's frames are read straight into the batch rows its
items hold (`ShardDataset.read_frames_into`), so a mixture costs no extra copy of the pixels.

What differs from a one-folder batch (keys as in datakit/loader/dataset.py, B items, S sources):
  source (B,) int64 - the item's index in `sources`
  state (B,Ts,D) / action (B,H,A) float32 - raw values zero-padded to the widest source's D / A
  state_mask (B,D) / action_mask (B,A) bool - the item's source has that channel
  task_index (B,) int64 - into `tasks`: every source's tasks in source order (a source's `prompt`
    replaces its tasks by that one text)
  slot_index (K,) - kept slots of the model's slots (`slot_names`, one per slot: the cameras behind it)
  episode_index, frame_index, row, timestamp - the source's own (`source` says which table)
  images.<j>.<g> (n_g,T,*shape_g) + image_items.<j>.<g> (n_g,) - a slot whose sources store its
    cameras at different sizes (DROID's 90x160 beside a 120x160 camera), split by size: group g
    holds the items of the sources of its size (`slots.slot_groups`); a batch whose items are all
    of one size carries the plain `images.<j>`
The device normaliser maps state and action with each item's own source's statistics
(`Normaliser.from_sources`); padded channels stay 0. It resizes each size group to the model's
input and puts it at its items' rows, as it resizes the per-slot views of one folder whose cameras
differ in size, so sources of any camera sizes mix without `datakit convert --resize`.

Sources must agree on what a batch tensor cannot mix: frame layout (rgb | nv12), frames per window,
and fps unless `LoaderConfig.fps` sets the windows' rate.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from datakit.loader.config import LoaderConfig
from datakit.loader.dataset import ShardDataset, batch_images
from datakit.loader.folder import drop_failed
from datakit.loader.reads import ReadPlan
from datakit.loader.mixture import MixtureSource, SourceOrders, normalised_weights
from datakit.loader.sampler import block_ids
from datakit.loader.slots import IMAGES, ITEMS, group_key, is_items_key, items_key, kept_slots, slot_key
from datakit.shards.index import ShardIndex


def source_config(cfg: LoaderConfig, source: MixtureSource) -> LoaderConfig:
    """The loader config one source is read with: the mixture's, with the source's own slots and episodes."""
    own = {k: v for k, v in (("slots", source.slots), ("episodes", source.episodes)) if v is not None}
    return dataclasses.replace(cfg, **own) if own else cfg


def mixture_block(cfg: LoaderConfig) -> int:
    """The schedule's block: the epoch batch (the optimiser's global batch), whatever the world size."""
    return cfg.epoch_batch or cfg.batch_size * cfg.world_size


class MixtureDataset(torch.utils.data.Dataset):
    """Map-style over global positions (epoch x len + position); batches via `__getitems__`."""

    def __init__(self, sources: tuple[MixtureSource, ...], cfg: LoaderConfig,
                 parts: list[ShardDataset] | None = None, widths: tuple[int, int] | None = None):
        """`parts`: the sources' datasets as the caller already opened them (one per source, in order).
        `widths`: pad state and action to at least these channel counts (some sources of a mixture read
        as the whole mixture pads them, e.g. one source's validation); None: the widest source's."""
        self.sources, self.cfg, self.widths = sources, cfg, widths
        self.parts = parts if parts is not None else []
        try:
            for s in sources[len(self.parts):]:
                self.parts.append(ShardDataset(s.root, source_config(cfg, s)))
            self._check()
        except BaseException:
            self.close()
            raise
        self._setup()

    def _check(self) -> None:
        """The refusals: one line naming both folders and what differs."""
        first, p0 = self.sources[0], self.parts[0]
        for src, p in zip(self.sources[1:], self.parts[1:]):
            pair = f"mixture sources {first.root} and {src.root}"
            if not self.cfg.fps and p.index.fps != p0.index.fps:
                raise ValueError(f"{pair} have different fps ({p0.index.fps:g} and {p.index.fps:g}); set the "
                                 "loader's fps (trainkit: data.fps) to the rate the windows count in")
            if p.index.layout != p0.index.layout:
                raise ValueError(f"{pair} store frames as {p0.index.layout} and {p.index.layout}; convert both "
                                 "with one --layout")
            if p.num_frames != p0.num_frames:
                raise ValueError(f"{pair} read {p0.num_frames} and {p.num_frames} frames per slot (camera_offsets)")

    def _setup(self) -> None:
        cfg, n = self.cfg, self.num_slots
        # slot_of[s][j]: source s's own slot behind model slot j (-1: the source has fewer slots)
        self.slot_of = [np.array([j if j < len(p.slots.cameras) else -1 for j in range(n)], np.int64)
                        for p in self.parts]
        cams = [[p.slots.cameras[j] for p in self.parts if j < len(p.slots.cameras)] for j in range(n)]
        self.slot_names = tuple("|".join(dict.fromkeys(c for c in cs if c is not None)) or f"empty_{j}"
                                for j, cs in enumerate(cams))
        # sizes[j]: the frame shapes the sources store slot j's cameras at, first seen first; group_of[s, j]:
        # source s's among them (0 where it has no camera there: blank frames at that size)
        sizes: list[list[tuple[int, ...]]] = [[] for _ in range(n)]
        self.group_of = np.zeros((len(self.parts), n), np.int64)
        for s, p in enumerate(self.parts):
            for j, cam in enumerate(p.slots.cameras):
                if cam is not None:
                    shape = tuple(p.slot_shapes[j])
                    if shape not in sizes[j]:
                        sizes[j].append(shape)
                    self.group_of[s, j] = sizes[j].index(shape)
        smallest = min((g[0] for g in sizes if g), key=lambda s: (int(np.prod(s)), s), default=(1,))
        self.slot_sizes = tuple(tuple(g) if g else (smallest,) for g in sizes)
        self.slot_shapes = tuple(g[0] for g in self.slot_sizes)
        self.stacked = len(set(self.slot_shapes)) == 1 and all(len(g) == 1 for g in self.slot_sizes)
        # a batch's largest: every item at the slot's largest size (what the workers' ring is sized by)
        self.slot_bytes = tuple(max(int(np.prod(s)) for s in g) for g in self.slot_sizes)
        self.num_frames = self.parts[0].num_frames
        self.files = SourceFiles(self.parts)
        least = self.widths or (0, 0)
        self.state_dim = max(least[0], *(p.state.shape[-1] for p in self.parts))
        self.action_dim = max(least[1], *(p.action.shape[-1] for p in self.parts))
        self.tasks: list[str] = []
        self.task_base = []
        for src, p in zip(self.sources, self.parts):
            self.task_base.append(len(self.tasks))
            self.tasks += [src.prompt] if src.prompt is not None else list(p.index.tasks)
        block = mixture_block(cfg)
        total = sum(len(p) for p in self.parts)
        self.epoch_len = max(total // block, 1) * block  # any length works: a multiple of the block keeps no tail
        blocks = tuple(block_ids(p.shard[p.anchors], cfg.block_size) if cfg.shuffle == "shard_block" else None
                       for p in self.parts)
        self.orders = SourceOrders(weights=normalised_weights(self.sources), block=block, seed=cfg.seed,
                                   sizes=tuple(len(p) for p in self.parts), mode=cfg.shuffle, blocks=blocks)

    @property
    def num_slots(self) -> int:
        return max(len(p.slots.cameras) for p in self.parts)

    @property
    def indexes(self) -> tuple[ShardIndex, ...]:
        return tuple(p.index for p in self.parts)

    def __len__(self) -> int:
        return self.epoch_len

    def __getstate__(self) -> dict[str, Any]:
        return {"sources": self.sources, "cfg": self.cfg, "parts": self.parts, "widths": self.widths}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.sources, self.cfg, self.parts, self.widths = state["sources"], state["cfg"], state["parts"], state["widths"]
        self._setup()

    def close(self) -> None:
        for p in self.parts:
            p.close()

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        raise TypeError("MixtureDataset serves whole batches (`read_batch`)")

    def __getitems__(self, positions: list[int]) -> dict[str, torch.Tensor]:
        return self.read_batch(positions)

    def read_batch(self, positions: list[int] | np.ndarray, prune: bool | None = None,
                   alloc: Callable[[tuple[int, ...]], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The batch of global `positions` (see the module docstring for its keys): every source's frames
        planned into the one buffer, then read in one `read_frames` (its shards numbered `SourceFiles`'s
        way), so a mixed batch costs the reads of one folder's."""
        source, local = self.orders(np.asarray(positions, np.int64))
        b, t = source.size, self.num_frames
        groups = [(s, idx) for s in range(len(self.parts)) if (idx := np.flatnonzero(source == s)).size]
        rows = np.empty(b, np.int64)
        real = np.zeros((b, self.num_slots), bool)
        for s, idx in groups:
            p = self.parts[s]
            rows[idx] = p.anchors[local[idx]]
            real[idx, : len(p.slots.cameras)] = p.slots.real[p.ep_of_row[rows[idx]]]
        keep = kept_slots(real, self.cfg.prune_slots if prune is None else prune)
        split = self._size_groups(source, keep)
        if split is None:
            flat, images, cells = batch_images(b, t, [self.slot_shapes[j] for j in keep.tolist()], self.stacked,
                                               alloc)
        else:
            flat, images, cells = group_images(b, t, split, alloc)
        view = memoryview(flat.numpy())
        image_is_pad = np.zeros((b, keep.size, t), bool)
        plans, sizes, numeric = [], [], []
        for s, idx in groups:
            p = self.parts[s]
            if split is None:
                image_is_pad[idx], plan, frame_bytes = p.frame_plan(rows[idx], self.slot_of[s][keep], cells, view, idx)
                plans.append(dataclasses.replace(plan, shard=plan.shard + self.files.base[s]))
                sizes.append(frame_bytes)
            for k, j in enumerate(keep.tolist() if split is not None else ()):  # one slot at a time
                cell, items = cells[k][self.group_of[s, j] if len(cells[k]) > 1 else 0]
                at = idx if items is None else np.searchsorted(items, idx)  # the items' rows in their group
                pad, plan, frame_bytes = p.frame_plan(rows[idx], self.slot_of[s][[j]], [cell], view, at)
                image_is_pad[idx, k] = pad[:, 0]
                plans.append(ReadPlan(shard=plan.shard + self.files.base[s], offset=plan.offset, dest=plan.dest,
                                      owner=plan.owner if items is None else items[plan.owner]))  # batch rows
                sizes.append(frame_bytes)
            numeric.append(p.numeric(rows[idx]))
        plan = ReadPlan(shard=np.concatenate([q.shard for q in plans]),
                        offset=np.concatenate([q.offset for q in plans]), dest=[d for q in plans for d in q.dest], owner=np.concatenate([q.owner for q in plans]))
        ok = self.parts[0].read_planned(self.files, plan, np.concatenate(sizes), b)
        batch = {
            **images,
            "image_mask": torch.from_numpy(real[:, keep]),
            "image_is_pad": torch.from_numpy(image_is_pad),
            "slot_index": torch.from_numpy(keep.astype(np.int64)),
            **self._numeric(groups, numeric, b),
            "source": torch.from_numpy(source),
        }
        return drop_failed_groups(batch, ok)

    def _size_groups(self, source: np.ndarray, keep: np.ndarray) -> list[list[tuple[tuple[int, ...], np.ndarray | None]]] | None:
        """Per kept slot, its frames' (shape, batch items) by size group when this batch's items store
        some kept slot at different sizes (items None: the whole batch); None when none does."""
        out, split = [], False
        for j in keep.tolist():
            gid = self.group_of[source, j]
            present = np.unique(gid)
            if present.size == 1:
                out.append([(self.slot_sizes[j][int(present[0])], None)])
                continue
            split = True
            out.append([(self.slot_sizes[j][g], np.flatnonzero(gid == g)) if g in present else ((0,), None)
                        for g in range(len(self.slot_sizes[j]))])
        return out if split else None

    def _numeric(self, groups: list[tuple[int, np.ndarray]], parts: list[dict[str, np.ndarray]],
                 b: int) -> dict[str, torch.Tensor]:
        """The sources' table columns in batch order: state/action zero-padded to the widest source with
        their channel masks, task_index into `tasks`."""
        order = np.concatenate([idx for _, idx in groups])
        back = np.empty(b, np.int64)
        back[order] = np.arange(b)  # batch row -> its place in the sources' concatenation
        for (s, _), cols in zip(groups, parts):
            cols["task_index"] = (np.full_like(cols["task_index"], self.task_base[s])
                                  if self.sources[s].prompt is not None else cols["task_index"] + self.task_base[s])
        out = {}
        for key in parts[0]:
            if key in ("state", "action"):
                width = self.state_dim if key == "state" else self.action_dim
                padded = [c[key] if c[key].shape[-1] == width else
                          np.pad(c[key], ((0, 0),) * (c[key].ndim - 1) + ((0, width - c[key].shape[-1]),))
                          for c in parts]
                mask = np.zeros((b, width), bool)
                for (_, idx), c in zip(groups, parts):
                    mask[idx, : c[key].shape[-1]] = True
                out[f"{key}_mask"] = torch.from_numpy(mask)
                out[key] = torch.from_numpy(np.concatenate(padded)[back])
            else:
                out[key] = torch.from_numpy(np.concatenate([c[key] for c in parts])[back])
        return out


def group_images(b: int, t: int, split: list[list[tuple[tuple[int, ...], np.ndarray | None]]],
                 alloc: Callable[[tuple[int, ...]], torch.Tensor] | None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[list[tuple[tuple[np.ndarray, int], np.ndarray | None]]]]:
    """`batch_images` for a batch with a slot split by size (`_size_groups`): one flat uint8 buffer, its
    tensors (`images.<k>` (B, T, *shape) for a slot of one size, `images.<k>.<g>` (n_g, T, *shape_g) and
    `image_items.<k>.<g>` per size group present) and per kept slot per group ((its (rows, T, frame bytes)
    numpy view, its first byte), its items or None): where `frame_plan` writes, each item at its row of
    its group."""
    layout, entries = [], []
    for k, groups in enumerate(split):
        for g, (shape, items) in enumerate(groups):
            if len(groups) == 1:
                layout.append((slot_key(k), (b, t, *shape)))
            elif items is not None:
                layout.append((group_key(k, g), (items.size, t, *shape)))
            entries.append((k, g, len(groups), shape, items))
    nbytes = sum(math.prod(shape) for _, shape in layout)
    flat = alloc((nbytes,)) if alloc is not None else torch.empty((nbytes,), dtype=torch.uint8)
    flat_np, at = flat.numpy(), 0
    images: dict[str, torch.Tensor] = {}
    cells: list[list[tuple[tuple[np.ndarray, int], np.ndarray | None]]] = [[] for _ in split]
    for key, shape in layout:
        n = math.prod(shape)
        images[key] = flat[at : at + n].view(shape)
        at += n
    for k, g, count, shape, items in entries:
        if count > 1 and items is None:  # a size no item of this batch has: never written
            cells[k].append(((np.zeros((0, t, 0), np.uint8), 0), None))
            continue
        tensor = images[slot_key(k) if count == 1 else group_key(k, g)]
        start = tensor.data_ptr() - flat.data_ptr()  # uint8: bytes
        cells[k].append(((flat_np[start : start + tensor.numel()].reshape(tensor.shape[0], t, -1), start), items))
        if count > 1:
            images[items_key(k, g)] = torch.from_numpy(items.astype(np.int64))
    return flat, images, cells


def drop_failed_groups(batch: dict[str, torch.Tensor], ok: np.ndarray) -> dict[str, torch.Tensor]:
    """`drop_failed` for a batch that may split slots by size: each group keeps its items whose shard
    read, renumbered to their rows in the smaller batch."""
    grouped = [k for k in batch if is_items_key(k)]
    if ok.all() or not grouped:
        return drop_failed(batch, ok)
    rows = np.cumsum(ok) - 1  # old batch row -> new
    order, kept = list(batch), {}
    for key in grouped:
        items = batch.pop(key).numpy()
        view_key = IMAGES + key[len(ITEMS):]
        sel = np.flatnonzero(ok[items])
        kept[view_key] = batch.pop(view_key).index_select(0, torch.from_numpy(sel))
        kept[key] = torch.from_numpy(rows[items[sel]])
    rest = drop_failed(batch, ok)
    # the keys in their first order: a worker compacts the image tensors into its buffer in this order
    return {k: kept[k] if k in kept else rest[k] for k in [*order, "num_skipped"]}


class SourceFiles:
    """The sources' open shards under one numbering, source s's shard i as `base[s] + i`, so one
    `read_frames` serves a whole mixed batch (`reads.ShardFiles`)."""

    def __init__(self, parts: list[ShardDataset]):
        self.parts = parts
        self.base = list(itertools.accumulate((len(p.index.shards) for p in parts), initial=0))

    def _of(self, shard: int) -> tuple[ShardDataset, int]:
        s = bisect.bisect_right(self.base, shard) - 1  # per read run: no numpy call
        return self.parts[s], shard - self.base[s]

    def fd(self, shard: int) -> int:
        part, i = self._of(shard)
        return part.files.fd(i)

    def path(self, shard: int) -> str | Path:
        part, i = self._of(shard)
        return part.files.path(i)

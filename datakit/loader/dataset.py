"""`ShardDataset`: step-granular samples over a converted folder, read as whole batches.

An item is an anchor (a row of the frames table) plus a window: image frames per camera
slot, states, and an action horizon, each clamped to the anchor's episode with an `is_pad`
mask. `__getitems__` (what `torch.utils.data.DataLoader` calls with a batch sampler) builds
the uint8 batch in one pass: numeric columns by numpy fancy indexing on the memory-mapped
frames table, pixels by coalesced `preadv` straight into the batch tensor (see `reads`).
Nothing is decoded; no tar is scanned.

A remote root (`s3://...`, `gs://...`) is read through a node-local download cache
(`storage.roots.open_root`, `cfg.cache_dir` / `cache_bytes`): its index files from the cache
folder, each shard's descriptor from the cache, which downloads the whole shard when needed.
DataLoader workers get the cache without its download thread and download on demand; the main
process downloads ahead of the sampler (`loader/downloads.py`).

Batch keys (B samples, K kept slots, T frames, Ts states, H actions):
  images (B,K,T,*frame_shape) uint8 - rgb (H,W,3) or nv12 (H*3/2,W), as stored (tiling, if
    configured, happens after the copy, in the normaliser: loader/tiling.py); when the slot
    cameras store frames of different sizes, instead images.<j> (B,T,*frame_shape_j) per kept
    slot j, each at its camera's size (`slots.slot_images` reads both forms)
  image_mask (B,K) bool - the slot holds a real camera for this sample
  image_is_pad (B,K,T) bool, slot_index (K,) int64 - kept slots, indices into `slot_names`
  state (B,Ts,D) float32, state_is_pad (B,Ts), action (B,H,A) float32, action_is_pad (B,H)
  episode_index, frame_index, task_index, row (B,) int64, timestamp (B,) float64
  num_skipped () int64 - samples dropped from this batch for a bad shard (on_error="skip")
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.utils.data

from datakit.errors import ShardError
from datakit.loader.anchors import EpisodeRows, Window, anchor_rows, window_rows
from datakit.loader.folder import FolderDataset, drop_failed, keep_episodes
from datakit.loader.normalise import Normaliser
from datakit.loader.reads import ReadPlan
from datakit.loader.slots import IMAGES, kept_slots, slot_frame_shapes, slot_key, slot_map
from datakit.shards.frames_check import check_reads
from datakit.shards.index import OFFSET_PREFIX, ShardIndex, column, load_frames, load_index
from datakit.shards.open_files import OpenShards
from datakit.stages.colour import blank_frames


class ShardDataset(FolderDataset):
    """Map-style dataset: position i is the i-th valid anchor; batches via `__getitems__`.
    `opened`: (folder, cache, index) of `root` as the caller already opened it (`FolderDataset`)."""

    def _open(self, index: ShardIndex | None = None) -> None:
        cfg, self.index = self.cfg, index if index is not None else load_index(self.folder)
        frames = load_frames(self.folder, self.index)
        self.slots = slot_map(self.index, cfg.slots, cfg.tile)
        self._rescale(cfg.fps / self.index.fps if cfg.fps else 1.0)
        used = [c for c in self.slots.cameras if c is not None]
        lengths = {len(self.offsets_for(c)) for c in used}
        if len(lengths) > 1:
            raise ValueError(f"slot cameras {used} read {sorted(lengths)} frames each (camera_offsets); give every "
                             "slot camera the same number of frame offsets, or map the others to no slot")
        self.num_frames = lengths.pop() if lengths else len(cfg.frame_offsets)
        self.slot_shapes = slot_frame_shapes(self.index, self.slots.cameras)
        # one stacked tensor when every slot's frames share a shape (the batch of old), else one per slot
        self.stacked = len(set(self.slot_shapes)) == 1
        self.slot_bytes = tuple(int(np.prod(s)) for s in self.slot_shapes)
        self.state = column(frames, "state")
        self.action = column(frames, "action")
        self.meta = {k: column(frames, k) for k in ("episode_index", "frame_index", "task_index", "timestamp")}
        self.shard = column(frames, "shard")
        self.offsets = {c: column(frames, OFFSET_PREFIX + c) for c in used}
        eps = self.index.episodes
        self.episodes = EpisodeRows(
            episode_index=np.array([e.episode_index for e in eps], np.int64),
            row_start=np.array([e.row_start for e in eps], np.int64),
            length=np.array([e.length for e in eps], np.int64),
        )
        self.ep_of_row = self.episodes.of_rows(len(self.shard))
        window = Window.of([self.offsets_for(c) for c in used], self.state_offsets, self.action_offsets[-1] + 1)
        self.anchors = self._selected(anchor_rows(self.episodes, window, cfg.boundary))
        # no read outside a shard, no task index LeRobotView cannot look up
        check_reads(self.index, self.shard, self.offsets, self.folder, task=self.meta["task_index"])
        self.files = OpenShards(self.folder, self.index.shards, verify=cfg.verify, max_open=cfg.max_open_shards,
                                cache=self.cache)
        self.num_skipped = 0

    def _rescale(self, per_frame: float) -> None:
        """The window's row offsets: the config's, counted in frames at `cfg.fps` when it is set
        (`per_frame` = cfg.fps / index fps; a mixture of sources at different rates), each mapped to
        this folder's nearest frame (a 30 fps folder read at 10 fps takes every third row)."""
        scale = lambda offs: tuple(int(round(o / per_frame)) for o in offs)  # noqa: E731
        self._frame_offsets = {c: scale(self.cfg.offsets_for(c)) for c in self.slots.cameras if c is not None}
        self.state_offsets = scale(self.cfg.state_offsets)
        self.action_offsets = scale(range(self.cfg.action_horizon))

    def offsets_for(self, camera: str) -> tuple[int, ...]:
        """Row offsets of `camera`'s frames around the anchor (`cfg.offsets_for`, at this folder's fps)."""
        return self._frame_offsets[camera]

    def _selected(self, anchors: np.ndarray) -> np.ndarray:
        """The anchors of `cfg.episodes` (all without it); ValueError naming episodes the index lacks."""
        wanted = self.cfg.episodes
        have = self.episodes.episode_index
        missing = sorted(set(wanted) - set(have.tolist())) if wanted is not None else []
        if missing:
            raise ValueError(f"episodes {missing[:8]} are not in the index (it has {have.size} episodes, "
                             f"episode_index {int(have.min())}..{int(have.max())})")
        return keep_episodes(anchors, have[self.ep_of_row[anchors]], wanted, "sample anchor for this window")

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self.slots.names

    def normaliser(self) -> Normaliser:
        """The device-side transform of this dataset's batches."""
        return Normaliser.from_index(self.index, self.cfg)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """One sample without the batch dimension (all slots kept, so keys and shapes are fixed)."""
        batch = self.read_batch([int(i)], prune=False)
        if batch["row"].numel() == 0:
            raise ShardError(self.root, f"sample {i} was skipped: its shard is damaged or missing")
        return {k: (v[0] if v.dim() and k not in ("slot_index", "num_skipped") else v) for k, v in batch.items()}

    def read_batch(self, positions: list[int] | np.ndarray, prune: bool | None = None,
                   alloc: Callable[[tuple[int, ...]], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The batch of `positions`. `alloc((nbytes,))` supplies the flat uint8 memory the images are
        read into (default: a new tensor); DataLoader workers pass a view of a reused shared-memory
        ring buffer (`shm_pool`). Every byte of it is written here, so a reused buffer needs no clearing.

        The kept slots' frames lie in that one buffer: stacked (B, K, T, *frame_shape) when every slot
        camera has one frame shape (the batch of old, unchanged), else slot after slot, (B, T,
        *frame_shape_j) each, each camera at its stored size (`slots.slot_images` reads either). Why
        per-slot views of one buffer and not a buffer padded to the largest camera: the bytes read,
        lent and copied to the device are the stored ones (a 96x128 view padded to 120x160 would be
        1.6x its bytes, a 224x224 one padded to 480x640 6x), and a batch is still one worker buffer,
        one loan and, with a registered ring, copied to the device straight from that page-locked
        memory, one `cudaMemcpyAsync` per slot."""
        cfg = self.cfg
        rows = self.anchors[np.asarray(positions, np.int64)]
        ep = self.ep_of_row[rows]
        real = self.slots.real[ep]
        keep = kept_slots(real, cfg.prune_slots if prune is None else prune)
        b = rows.size
        flat, images, cells = batch_images(b, self.num_frames, [self.slot_shapes[s] for s in keep.tolist()],
                                           self.stacked, alloc)
        image_is_pad, plan, frame_bytes = self.frame_plan(rows, keep, cells, memoryview(flat.numpy()), np.arange(b))
        ok = self.read_planned(self.files, plan, frame_bytes, b)
        batch = {
            **images,
            "image_mask": torch.from_numpy(real[:, keep]),
            "image_is_pad": torch.from_numpy(image_is_pad),
            "slot_index": torch.from_numpy(keep.astype(np.int64)),
            **{k: torch.from_numpy(v) for k, v in self.numeric(rows).items()},
        }
        return drop_failed(batch, ok)

    def frame_plan(self, rows: np.ndarray, slots: np.ndarray, cells: list[tuple[np.ndarray, int]],
                   view: memoryview, owner: np.ndarray) -> tuple[np.ndarray, ReadPlan, np.ndarray]:
        """The reads of anchor `rows`' (n,) frames for this folder's slots `slots` (K,) into `cells`: per
        kept slot j, (its (B, T, frame bytes) numpy view of the batch buffer, its first byte in `view`);
        item i fills batch row `owner[i]` (a mixture's batch interleaves its sources' items), the plan's
        owners are those batch rows. A slot entry -1, a slot without a camera or a missing frame is written
        black now (`blank_frames`). Returns image_is_pad (n, K, T), the plan and each read's frame bytes."""
        n, t = rows.size, self.num_frames
        ep = self.ep_of_row[rows]
        start, length = self.episodes.row_start[ep], self.episodes.length[ep]
        image_is_pad = np.zeros((n, slots.size, t), bool)
        shards, offs, owners, sizes, dests = [], [], [], [], []
        for j, s in enumerate(slots.tolist()):
            cells_j, first = cells[j]
            cam = self.slots.cameras[s] if s >= 0 else None
            if cam is None:
                blank_frames(cells_j, (owner,), self.index.layout)
                continue
            fb = self.slot_bytes[s]
            r, pad = window_rows(rows, self.offsets_for(cam), start, length)
            image_is_pad[:, j] = pad
            off = self.offsets[cam][r]
            missing = off < 0
            if missing.any():
                mb, mt = np.nonzero(missing)
                blank_frames(cells_j, (owner[mb], mt), self.index.layout)
            bi, ti = np.nonzero(~missing)
            shards.append(self.shard[r[bi, ti]])
            offs.append(off[bi, ti])
            owners.append(owner[bi])
            sizes.append(np.full(bi.size, fb, np.int64))
            at = first + owner[bi] * cells_j.strides[0] + ti * cells_j.strides[1]
            dests += [view[a : a + fb] for a in at.tolist()]
        empty = np.zeros(0, np.int64)
        plan = ReadPlan(shard=np.concatenate(shards) if shards else empty,
                        offset=np.concatenate(offs) if offs else empty, dest=dests,
                        owner=np.concatenate(owners) if owners else empty)
        return image_is_pad, plan, np.concatenate(sizes) if sizes else empty

    def numeric(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The batch's table columns for anchor `rows`: state and action windows with their pad masks, and
        the row's own episode, frame, task, timestamp."""
        ep = self.ep_of_row[rows]
        start, length = self.episodes.row_start[ep], self.episodes.length[ep]
        rs, pad_s = window_rows(rows, self.state_offsets, start, length)
        ra, pad_a = window_rows(rows, self.action_offsets, start, length)
        return {"state": self.state[rs], "state_is_pad": pad_s, "action": self.action[ra], "action_is_pad": pad_a,
                "row": rows, **{k_: np.ascontiguousarray(v[rows]) for k_, v in self.meta.items()}}


def batch_images(b: int, t: int, shapes: list[tuple[int, ...]], stacked: bool,
                 alloc: Callable[[tuple[int, ...]], torch.Tensor] | None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[tuple[np.ndarray, int]]]:
    """One batch's image memory for kept slots of frame `shapes`: the flat uint8 buffer (`alloc`, or a new
    tensor), its tensors by key (stacked (B, K, T, *shape) or `images.<j>` (B, T, *shape_j) each) and per
    slot (its (B, T, frame bytes) numpy view, its first byte): where `read_frames_into` writes."""
    k = len(shapes)
    layout = ([(IMAGES, (b, k, t, *shapes[0]))] if stacked
              else [(slot_key(j), (b, t, *shape)) for j, shape in enumerate(shapes)])
    nbytes = sum(math.prod(shape) for _, shape in layout)
    flat = alloc((nbytes,)) if alloc is not None else _new_tensor((nbytes,), torch.uint8)
    flat_np = flat.numpy()
    cells, block = [], 0
    for j, shape in enumerate(shapes):
        fb = math.prod(shape)
        if stacked:
            cells.append((flat_np.reshape(b, k, t, fb)[:, j], j * t * fb))
        else:
            cells.append((flat_np[block : block + b * t * fb].reshape(b, t, fb), block))
            block += b * t * fb
    return flat, _carve(flat, layout), cells


def _carve(flat: torch.Tensor, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """`layout`'s tensors as consecutive views of the flat buffer, in order."""
    if len(layout) == 1:
        return {layout[0][0]: flat.view(layout[0][1])}
    out, at = {}, 0
    for key, shape in layout:
        n = math.prod(shape)
        out[key] = flat[at : at + n].view(shape)
        at += n
    return out


def _new_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """In a DataLoader worker, allocate straight in shared memory (as default_collate does),
    so handing the batch to the main process costs no copy."""
    if torch.utils.data.get_worker_info() is not None:
        n = int(np.prod(shape))
        storage = torch.UntypedStorage._new_shared(max(n, 1) * torch.empty((), dtype=dtype).element_size())
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape)[...] if n else torch.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=dtype)


def identity_collate(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`collate_fn` for a DataLoader over `ShardDataset`: `__getitems__` already collated."""
    return batch

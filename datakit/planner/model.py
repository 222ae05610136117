"""The throughput plan: from an index and a loader config, what N samples/s across R ranks need.

Every number follows from the index and the sampler's order, without reading a shard:
- bytes per sample: image bytes the loader reads from shards for one sample (frames of each
  slot camera at each offset, clamped to the episode as the loader clamps; a camera with no
  video in an episode costs nothing), averaged over every anchor of the epoch, plus the state
  and action floats read from the memory-mapped frames table;
- read bandwidth per node = samples/s x bytes per sample x (ranks on the node / ranks);
- the epoch's working set: the bytes of the distinct shards a rank (a node: the union of its
  ranks) reads in one epoch, from the sampler's actual order; a cache that holds it downloads
  each shard once per epoch. The peak bytes of one step is the floor below which a cache
  thrashes within a step; with `cache_bytes` given, an LRU simulation of the node's reads in
  order gives the bytes downloaded per epoch (what `storage.cache.ShardCache` would fetch);
- host-to-device bytes per step and rank: the batch as the loader hands it over (uint8 images,
  at most every slot that some episode fills) against the same images as float32.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from datakit.loader.anchors import EpisodeRows, Window, anchor_rows
from datakit.loader.config import LoaderConfig
from datakit.loader.sampler import block_ids, epoch_order
from datakit.shards.index import OFFSET_PREFIX, SLOT_REAL, ShardIndex, column

FLOAT32 = 4
INT64 = 8


@dataclass
class ThroughputPlan:
    samples_per_s: float  # the target, all ranks together
    ranks: int
    ranks_per_node: int
    nodes: int
    batch_size: int  # per rank
    shuffle: str
    num_anchors: int  # samples per epoch (before drop_last)
    steps_per_epoch: int
    epoch_seconds: float  # at the target rate
    steps_per_s: float  # per rank
    dataset_bytes: int  # all shards
    image_bytes_per_sample: float
    numeric_bytes_per_sample: int
    bytes_per_sample: float
    read_bytes_per_s_per_rank: float
    read_bytes_per_s_per_node: float
    working_set_bytes_per_rank: int  # max over ranks: distinct shards read in one epoch
    working_set_bytes_per_node: int  # max over nodes: union of its ranks
    peak_step_bytes_per_node: int  # max over steps: distinct shards one step of a node reads
    h2d_image_bytes_per_step_uint8: int  # per rank
    h2d_image_bytes_per_step_float32: int
    h2d_other_bytes_per_step: int  # state, action, masks, indices
    h2d_bytes_per_s_uint8: float  # per rank (per GPU)
    h2d_bytes_per_s_float32: float
    cache_bytes: int | None = None  # the LRU simulation's cache size per node
    downloaded_bytes_per_epoch_per_node: int | None = None
    download_bytes_per_s_per_node: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def slot_cameras(index: ShardIndex, cfg: LoaderConfig) -> tuple[str | None, ...]:
    """The model's slots as dataset cameras (empty `slots`: every camera of the index)."""
    cams = tuple(cfg.slots) if cfg.slots else tuple(index.cameras)
    unknown = [c for c in cams if c is not None and c not in index.cameras]
    if unknown:
        raise ValueError(f"slots name unknown cameras {unknown}; the index has {list(index.cameras)}")
    return cams


def _episode_rows(index: ShardIndex) -> EpisodeRows:
    eps = sorted(index.episodes, key=lambda e: e.row_start)
    return EpisodeRows(episode_index=np.array([e.episode_index for e in eps], np.int64),
                       row_start=np.array([e.row_start for e in eps], np.int64),
                       length=np.array([e.length for e in eps], np.int64))


def image_bytes_per_anchor(index: ShardIndex, frames: pa.Table, cfg: LoaderConfig, anchors: np.ndarray,
                           episodes: EpisodeRows) -> np.ndarray:
    """(M,) image bytes the loader reads from shards for each anchor's sample."""
    ep = np.searchsorted(episodes.row_start, anchors, side="right") - 1
    lo, hi = episodes.row_start[ep], episodes.row_start[ep] + episodes.length[ep] - 1
    out = np.zeros(anchors.size, np.int64)
    for cam in {c for c in slot_cameras(index, cfg) if c is not None}:
        off, fb = column(frames, OFFSET_PREFIX + cam), index.cameras[cam].frame_bytes
        for o in cfg.offsets_for(cam):
            out += fb * (off[np.clip(anchors + o, lo, hi)] >= 0)
    return out


def _lru_download_bytes(steps: list[np.ndarray], sizes: np.ndarray, capacity: int) -> int:
    """Bytes an LRU cache of `capacity` downloads for the shard reads of `steps`, in order."""
    cache: OrderedDict[int, int] = OrderedDict()
    used = downloaded = 0
    for shards in steps:
        for s in shards.tolist():
            if s in cache:
                cache.move_to_end(s)
                continue
            downloaded += int(sizes[s])
            cache[s] = int(sizes[s])
            used += int(sizes[s])
            while used > capacity and len(cache) > 1:
                _, size = cache.popitem(last=False)
                used -= size
    return downloaded


def plan_throughput(index: ShardIndex, frames: pa.Table, cfg: LoaderConfig, *, samples_per_s: float, ranks: int = 1,
                    ranks_per_node: int = 8, cache_bytes: int | None = None, epoch: int = 0) -> ThroughputPlan:
    """The plan for `samples_per_s` (all ranks) with `cfg`'s sample shape, batch and shuffle."""
    if samples_per_s <= 0 or ranks < 1 or ranks_per_node < 1:
        raise ValueError("samples_per_s > 0, ranks >= 1 and ranks_per_node >= 1 are required")
    cfg = dataclasses.replace(cfg, world_size=ranks, rank=0)
    episodes = _episode_rows(index)
    used = [c for c in slot_cameras(index, cfg) if c is not None]
    window = Window.of([cfg.offsets_for(c) for c in used], cfg.state_offsets, cfg.action_horizon)
    anchors = anchor_rows(episodes, window, cfg.boundary)
    m, b, w = anchors.size, cfg.batch_size, ranks
    if m < b * w:
        raise ValueError(f"{m} samples cannot fill one global batch of {b * w} ({w} ranks x {b})")
    image = image_bytes_per_anchor(index, frames, cfg, anchors, episodes)
    numeric = (len(cfg.state_offsets) * len(index.state_names) + cfg.action_horizon * len(index.action_names)) * FLOAT32
    per_sample = float(image.mean()) + numeric

    shard_of_row = column(frames, "shard").astype(np.int64)
    sizes = np.array([s.bytes for s in index.shards], np.int64)
    anchor_shard = shard_of_row[anchors]  # an episode lies in one shard, so its window does too
    blocks = block_ids(anchor_shard, cfg.block_size) if cfg.shuffle == "shard_block" else None
    order = epoch_order(m, seed=cfg.seed, epoch=epoch, mode=cfg.shuffle, blocks=blocks)
    steps = m // (b * w) if cfg.drop_last else -(-m // (b * w))
    pos = (np.arange(steps)[:, None, None] * w + np.arange(w)[None, :, None]) * b + np.arange(b)[None, None, :]
    read = anchor_shard[order[pos % m]]  # (steps, ranks, batch): shard of every sample read
    g = min(ranks_per_node, w)
    nodes = -(-w // g)

    def distinct_bytes(a: np.ndarray) -> int:
        return int(sizes[np.unique(a)].sum())

    ws_rank = max(distinct_bytes(read[:, r]) for r in range(w))
    node_reads = [read[:, n * g:(n + 1) * g].reshape(steps, -1) for n in range(nodes)]
    ws_node = max(distinct_bytes(a) for a in node_reads)
    peak = 0
    for a in node_reads:
        s = np.sort(a, axis=1)
        first = np.ones_like(s, bool)
        first[:, 1:] = s[:, 1:] != s[:, :-1]
        peak = max(peak, int((sizes[s] * first).sum(axis=1).max()))
    downloaded = None
    if cache_bytes is not None:
        downloaded = max(_lru_download_bytes([np.unique(row) for row in a], sizes, cache_bytes) for a in node_reads)

    slots = slot_cameras(index, cfg)
    kept = [c for c in slots if c is not None and index.cameras[c].slot == SLOT_REAL] if cfg.prune_slots else list(slots)
    t = len(cfg.offsets_for(used[0])) if used else len(cfg.frame_offsets)
    fb = index.cameras[used[0]].frame_bytes if used else 0
    k = len(kept)
    img_u8 = b * k * t * fb
    other = b * numeric + b * (k + k * t + len(cfg.state_offsets) + cfg.action_horizon) + 5 * INT64 * b + INT64 * k
    steps_per_s = samples_per_s / (w * b)
    epoch_s = steps * w * b / samples_per_s
    return ThroughputPlan(
        samples_per_s=samples_per_s, ranks=w, ranks_per_node=g, nodes=nodes, batch_size=b, shuffle=cfg.shuffle,
        num_anchors=m, steps_per_epoch=steps, epoch_seconds=epoch_s, steps_per_s=steps_per_s,
        dataset_bytes=int(sizes.sum()), image_bytes_per_sample=float(image.mean()), numeric_bytes_per_sample=numeric,
        bytes_per_sample=per_sample, read_bytes_per_s_per_rank=samples_per_s / w * per_sample,
        read_bytes_per_s_per_node=samples_per_s * g / w * per_sample,
        working_set_bytes_per_rank=ws_rank, working_set_bytes_per_node=ws_node, peak_step_bytes_per_node=peak,
        h2d_image_bytes_per_step_uint8=img_u8, h2d_image_bytes_per_step_float32=img_u8 * FLOAT32,
        h2d_other_bytes_per_step=other, h2d_bytes_per_s_uint8=steps_per_s * (img_u8 + other),
        h2d_bytes_per_s_float32=steps_per_s * (img_u8 * FLOAT32 + other),
        cache_bytes=cache_bytes, downloaded_bytes_per_epoch_per_node=downloaded,
        download_bytes_per_s_per_node=None if downloaded is None else downloaded / epoch_s,
    )

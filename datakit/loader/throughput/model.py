"""The throughput plan: from an index and a loader config, what N samples/s across R ranks need.

Every number follows from the index and the loader's own sampler order, without reading a shard:
- bytes per sample: image bytes the loader reads from shards, batch by batch as it reads them:
  only the slots the batch keeps (the loader's rule, `loader.slots.kept_slots`: a blank camera
  in every sample of a batch is pruned and never read), each frame of a slot camera at each
  offset clamped to the episode, a frame asked twice in one batch read once, a camera with no
  video in an episode costing nothing; averaged over the epoch's samples, plus the state and
  action floats read from the memory-mapped frames table. Not counted: the bytes between
  nearby frames that a coalesced read passes over (`coalesce_gap`);
- read bandwidth per node = samples/s x bytes per sample x (ranks on the node / ranks);
- the epoch's working set: the bytes of the distinct shards a rank (a node: the union of its
  ranks) reads in one epoch, from the sampler's actual order; a cache that holds it downloads
  each shard once per epoch. The peak bytes of one step is the floor below which a cache
  thrashes within a step; with `cache_bytes` given, an LRU simulation of the node's reads in
  order gives the bytes downloaded per epoch (what `storage.cache.ShardCache` would fetch);
- host-to-device bytes per step and rank: the batch as the loader hands it over (uint8 images
  of the kept slots, each camera at its stored frame size, masks, state, action, indices), mean
  over the epoch's batches, against the same images as float32.
Cameras may store frames of different sizes (a 96x128 wrist camera beside a 120x160 scene
camera): every byte count takes each camera's own frame bytes, and the image bytes per sample
are also given per camera.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from datakit.loader.anchors import EpisodeRows, Window, anchor_rows, window_rows
from datakit.loader.config import LoaderConfig
from datakit.loader.sampler import StepSampler, block_ids
from datakit.loader.slots import kept_slots, slot_frame_shapes, slot_map
from datakit.shards.index import OFFSET_PREFIX, ShardIndex, column

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
    image_bytes_per_sample: float  # frame bytes the loader reads from shards (kept slots, each frame once per batch)
    image_bytes_per_sample_by_camera: dict[str, float]  # the same, per slot camera (its own frame size)
    numeric_bytes_per_sample: int
    bytes_per_sample: float
    read_bytes_per_s_per_rank: float
    read_bytes_per_s_per_node: float
    working_set_bytes_per_rank: int  # max over ranks: distinct shards read in one epoch
    working_set_bytes_per_node: int  # max over nodes: union of its ranks
    peak_step_bytes_per_node: int  # max over steps: distinct shards one step of a node reads
    kept_slots_per_step: float  # image slots a batch keeps (pruning), mean over the epoch's batches
    h2d_image_bytes_per_step_uint8: float  # per rank, mean over the epoch's batches
    h2d_image_bytes_per_step_float32: float
    h2d_other_bytes_per_step: float  # state, action, masks, indices
    h2d_bytes_per_s_uint8: float  # per rank (per GPU)
    h2d_bytes_per_s_float32: float
    cache_bytes: int | None = None  # the LRU simulation's cache size per node
    downloaded_bytes_per_epoch_per_node: int | None = None
    download_bytes_per_s_per_node: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _episode_rows(index: ShardIndex) -> EpisodeRows:
    """The episodes in index order, as `ShardDataset` holds them (slot_map's rows follow it)."""
    eps = index.episodes
    return EpisodeRows(episode_index=np.array([e.episode_index for e in eps], np.int64),
                       row_start=np.array([e.row_start for e in eps], np.int64),
                       length=np.array([e.length for e in eps], np.int64))


def batch_kept(real: np.ndarray, prune: bool) -> np.ndarray:
    """(N, S) bool: the slots each of N batches keeps, given their (N, B, S) `real` matrices.

    The loader's own rule (`slots.kept_slots`), called once per distinct batch matrix: every
    batch of a dataset whose episodes all share one camera status is the same call."""
    n, b, s = real.shape
    keys, first, inverse = np.unique(np.packbits(real.reshape(n, b * s), axis=1), axis=0, return_index=True,
                                     return_inverse=True)
    out = np.zeros((keys.shape[0], s), bool)
    for g, i in enumerate(first.tolist()):
        out[g, kept_slots(real[i], prune)] = True
    return out[inverse.reshape(-1)]


def distinct_frames(rows: np.ndarray, has_frame: np.ndarray) -> np.ndarray:
    """(N,) frames one camera's reads of each batch fetch from shards: the distinct `rows` (N, K)
    of a batch where the camera has a frame (`has_frame`, per row of the frames table). The loader
    reads a frame asked twice in one batch (a padded edge, overlapping clips) once and copies it
    (`reads.read_frames`)."""
    r = np.sort(rows, axis=1)
    first = np.ones_like(r, bool)
    first[:, 1:] = r[:, 1:] != r[:, :-1]
    return (first & has_frame[r]).sum(axis=1)


def image_reads(index: ShardIndex, frames: pa.Table, cfg: LoaderConfig, anchors: np.ndarray, episodes: EpisodeRows,
                batches: np.ndarray, chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """Per batch of anchor positions `batches` (N, B): the image bytes the loader reads from shards
    for each slot (N, S), each camera's frames at its own frame bytes, and the (N, S) slots it keeps,
    by the loader's slot rule (`slot_map`, `kept_slots`)."""
    smap = slot_map(index, cfg.slots, cfg.tile)
    n, b = batches.shape
    rows = anchors[batches]  # (N, B) anchor rows
    ep = episodes.of_rows(frames.num_rows)[rows]
    kept = batch_kept(smap.real[ep], cfg.prune_slots)
    read = np.zeros((n, len(smap.cameras)), np.int64)
    longest = max((len(cfg.offsets_for(c)) for c in smap.cameras if c is not None), default=1)
    step = max(1, chunk // (b * longest))  # batches per chunk: bounded temporaries at any index size
    for s, cam in enumerate(smap.cameras):
        if cam is None:
            continue
        has_frame = column(frames, OFFSET_PREFIX + cam) >= 0
        fb, offsets = index.cameras[cam].frame_bytes, cfg.offsets_for(cam)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            r, e = rows[lo:hi].reshape(-1), ep[lo:hi].reshape(-1)
            win, _ = window_rows(r, offsets, episodes.row_start[e], episodes.length[e])
            win = win.reshape(hi - lo, b * len(offsets))
            read[lo:hi, s] = fb * kept[lo:hi, s] * distinct_frames(win, has_frame)
    return read, kept


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
    smap = slot_map(index, cfg.slots, cfg.tile)
    used = [c for c in smap.cameras if c is not None]
    window = Window.of([cfg.offsets_for(c) for c in used], cfg.state_offsets, cfg.action_horizon)
    anchors = anchor_rows(episodes, window, cfg.boundary)
    m, b, w = anchors.size, cfg.batch_size, ranks
    shard_of_row = column(frames, "shard").astype(np.int64)
    sizes = np.array([s.bytes for s in index.shards], np.int64)
    anchor_shard = shard_of_row[anchors]  # an episode lies in one shard, so its window does too
    # the loader's own sampler: its order, epoch length (drop_last, epoch_batch) and checks
    sampler = StepSampler(num_anchors=m, batch_size=b, seed=cfg.seed, mode=cfg.shuffle, world_size=w,
                          drop_last=cfg.drop_last, epoch_batch=cfg.epoch_batch,
                          blocks=block_ids(anchor_shard, cfg.block_size) if cfg.shuffle == "shard_block" else None)
    order, steps = sampler.order(epoch), sampler.steps_per_epoch
    pos = (np.arange(steps)[:, None, None] * w + np.arange(w)[None, :, None]) * b + np.arange(b)[None, None, :]
    batches = order[pos % m]  # (steps, ranks, batch): anchor position of every sample read
    read_img, kept = image_reads(index, frames, cfg, anchors, episodes, batches.reshape(-1, b))
    numeric = (len(cfg.state_offsets) * len(index.state_names) + cfg.action_horizon * len(index.action_names)) * FLOAT32
    image_per_sample = float(read_img.sum(axis=1).mean()) / b
    by_camera = {cam: float(read_img[:, s].mean()) / b for s, cam in enumerate(smap.cameras) if cam is not None}
    per_sample = image_per_sample + numeric

    read = anchor_shard[batches]  # (steps, ranks, batch): shard of every sample read
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

    # host-to-device: the batch as the loader hands it over, averaged over the epoch's batches; every
    # kept slot at its camera's frame size (an empty slot at the loader's, `slot_frame_shapes`)
    t = len(cfg.offsets_for(used[0])) if used else len(cfg.frame_offsets)
    slot_bytes = np.array([int(np.prod(shape)) for shape in slot_frame_shapes(index, smap.cameras)], np.int64)
    k = float(kept.sum(axis=1).mean())  # kept slots per batch
    img_u8 = b * t * float((kept @ slot_bytes).mean())
    # image_mask, image_is_pad, state/action pads (bool); 5 int64/float64 per sample; slot_index, num_skipped
    other = (b * numeric + b * (k + k * t + len(cfg.state_offsets) + cfg.action_horizon) + 5 * INT64 * b
             + INT64 * (k + 1))
    steps_per_s = samples_per_s / (w * b)
    epoch_s = steps * w * b / samples_per_s
    return ThroughputPlan(
        samples_per_s=samples_per_s, ranks=w, ranks_per_node=g, nodes=nodes, batch_size=b, shuffle=cfg.shuffle,
        num_anchors=m, steps_per_epoch=steps, epoch_seconds=epoch_s, steps_per_s=steps_per_s,
        dataset_bytes=int(sizes.sum()), image_bytes_per_sample=image_per_sample,
        image_bytes_per_sample_by_camera=by_camera, numeric_bytes_per_sample=numeric,
        bytes_per_sample=per_sample, read_bytes_per_s_per_rank=samples_per_s / w * per_sample,
        read_bytes_per_s_per_node=samples_per_s * g / w * per_sample,
        working_set_bytes_per_rank=ws_rank, working_set_bytes_per_node=ws_node, peak_step_bytes_per_node=peak,
        kept_slots_per_step=k, h2d_image_bytes_per_step_uint8=img_u8, h2d_image_bytes_per_step_float32=img_u8 * FLOAT32,
        h2d_other_bytes_per_step=other, h2d_bytes_per_s_uint8=steps_per_s * (img_u8 + other),
        h2d_bytes_per_s_float32=steps_per_s * (img_u8 * FLOAT32 + other),
        cache_bytes=cache_bytes, downloaded_bytes_per_epoch_per_node=downloaded,
        download_bytes_per_s_per_node=None if downloaded is None else downloaded / epoch_s,
    )

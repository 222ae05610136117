"""The shard plan: which episodes go into which shard, from the source metadata alone.

Every engine (the local process pool here, a cluster engine later) starts from this plan:
it depends only on the scanned source and the options, so any worker, on any machine, run
again after a crash, gives the same shard boundaries and the same bytes.
"""
from __future__ import annotations

import numpy as np

from datakit.convert.config import ConvertConfig
from datakit.shards.writer import BLOCK, npy_header
from datakit.sources.episode import DatasetSpec, EpisodeRef
from datakit.stages.colour import stored_shape


def _member_bytes(payload: int) -> int:
    """A tar member: one header block plus the payload padded to whole blocks."""
    return BLOCK + -(-payload // BLOCK) * BLOCK


def predicted_bytes(spec: DatasetSpec, cfg: ConvertConfig, ref: EpisodeRef) -> int:
    """Bytes an episode will take in a shard, from metadata alone (json assumed < 512 bytes)."""
    per_frame = 0
    for cam, cs in spec.cameras.items():
        if cs.storage == "image" or ref.videos.get(cam) is not None:
            h, w = cfg.size or (cs.height, cs.width)
            shape = stored_shape(cfg.layout, h, w)
            per_frame += _member_bytes(len(npy_header(shape, np.dtype(np.uint8))) + int(np.prod(shape)))
    for dim in (len(spec.state_names), len(spec.action_names)):
        per_frame += _member_bytes(len(npy_header((dim,), np.dtype(np.float32))) + 4 * dim)
    per_frame += _member_bytes(1)  # json
    return ref.length * per_frame


def plan_shards(spec: DatasetSpec, cfg: ConvertConfig) -> list[list[EpisodeRef]]:
    """Consecutive episodes per shard; a shard ends after the episode that reaches --shard-size."""
    plan: list[list[EpisodeRef]] = [[]]
    size = 0
    for ref in spec.episodes:
        plan[-1].append(ref)
        size += predicted_bytes(spec, cfg, ref)
        if size >= cfg.shard_size:
            plan.append([])
            size = 0
    return [p for p in plan if p]

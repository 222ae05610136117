"""Index assembly: the manifest and the per-frame table, from the shards' journals alone.

It reads no shard and runs no decoder, so any engine that produced the journals (in any
order, on any machine) assembles the same index.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from datakit.convert.config import ConvertConfig
from datakit.convert.journal import Journal
from datakit.errors import SourceError
from datakit.shards.index import CameraEntry, EpisodeEntry, ShardEntry, ShardIndex, frames_schema, member_schema
from datakit.shards.stats import finite_vector_stats
from datakit.sources.episode import DatasetSpec
from datakit.stages.colour import stored_shape
from datakit.stages.camera_status import dataset_status


def _stats(x: np.ndarray) -> dict[str, Any]:
    """Statistics over the finite values; values left out (NaN/inf kept by nonfinite="keep")
    are flagged by a per-dimension count under "nonfinite"."""
    stats, excluded = finite_vector_stats(x)
    return {**stats, "nonfinite": excluded} if any(excluded) else stats


def build_index(spec: DatasetSpec, cfg: ConvertConfig, journals: list[Journal],
                fingerprint: dict[str, Any] | None = None) -> tuple[ShardIndex, pa.Table]:
    """The manifest and the per-frame table from the shards' journals (in shard order).

    A shard whose episodes were all skipped holds none: it is left out of the index, so every
    listed shard holds the episodes its range names (`empty_shards` lists those files for the
    caller to remove). Frames and episodes name a shard by its position in `index.shards`.
    No episode placed at all (every one skipped) is a SourceError naming the source: an index
    of nothing would verify, then fail in the loader."""
    held = [j for j in journals if j.placed]
    position = {j.index: k for k, j in enumerate(held)}
    placed = [p for j in held for p in j.placed]
    skipped = [s for j in journals for s in j.skipped]
    if not placed:
        first = skipped[0] if skipped else None
        why = f"; the first, episode {first.episode_index}: {first.reason}" if first else ""
        raise SourceError(spec.root, f"all {len(skipped)} episodes were skipped as bad input (--on-error skip){why}; "
                                     "an output without episodes is not written")
    shards, row = [], 0
    for j in held:
        n = sum(p.length for p in j.placed)
        shards.append(ShardEntry(j.name, j.bytes, j.sha256, [j.placed[0].episode_index, j.placed[-1].episode_index],
                                 [row, row + n], n))
        row += n
    cams = list(spec.cameras)
    size = cfg.size
    cameras: dict[str, CameraEntry] = {}
    for cam, cs in spec.cameras.items():
        h, w = size if size else (cs.height, cs.width)
        shape = stored_shape(cfg.layout, h, w)
        statuses = [p.camera_status[cam] for p in placed]
        counts = {s: statuses.count(s) for s in ("real", "blank", "missing")}
        cameras[cam] = CameraEntry(h, w, dataset_status(statuses), list(shape), int(np.prod(shape)), cs.height, cs.width, counts)
    episodes, row = [], 0
    for p in placed:
        episodes.append(EpisodeEntry(p.episode_index, p.length, position[p.shard], row, p.task, p.camera_status))
        row += p.length
    sd, ad = len(spec.state_names), len(spec.action_names)
    state = np.concatenate([p.state for p in placed]).astype(np.float32).reshape(-1, sd)
    action = np.concatenate([p.action for p in placed]).astype(np.float32).reshape(-1, ad)
    cols = {
        "episode_index": np.concatenate([np.full(p.length, p.episode_index, np.int64) for p in placed]),
        "frame_index": np.concatenate([p.frame_index for p in placed]).astype(np.int64),
        "timestamp": np.concatenate([p.timestamp for p in placed]).astype(np.float64),
        "task_index": np.concatenate([p.task_index for p in placed]).astype(np.int64),
    }
    arrays = [pa.array(cols[k]) for k in cols]
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), sd))
    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), ad))
    arrays.append(pa.array(np.concatenate([np.full(p.length, position[p.shard], np.int32) for p in placed])))
    for cam in cams:
        offs = [np.where(p.offsets[cam] >= 0, p.offsets[cam] + p.base, -1) for p in placed]
        arrays.append(pa.array(np.concatenate(offs).astype(np.int64)))
    table = pa.Table.from_arrays(arrays, schema=frames_schema(cams, sd, ad))
    source: dict[str, Any] = {"format": spec.format, "version": spec.version, "name": spec.root.name}
    if spec.described:
        source["described"] = spec.described
    if fingerprint is not None:
        source["fingerprint"] = fingerprint
    index = ShardIndex(
        fps=spec.fps, layout=cfg.layout, cameras=cameras, state_names=spec.state_names, action_names=spec.action_names,
        tasks=spec.tasks, stats={"state": _stats(state), "action": _stats(action)},
        shards=shards, episodes=episodes,
        skipped=[{"episode_index": s.episode_index, "source": s.source, "reason": s.reason} for s in skipped],
        source=source,
        options=cfg.output_options(), num_episodes=len(episodes), num_frames=row, num_shards=len(shards),
        schema=member_schema(cameras, sd, ad),
    )
    return index, table


def empty_shards(journals: list[Journal]) -> list[str]:
    """Shard files that hold no episode (all skipped): not in the index, not needed."""
    return [j.name for j in journals if not j.placed]

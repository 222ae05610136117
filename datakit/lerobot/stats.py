"""Normalisation statistics as LeRobot 0.6.1 computes them, from a shard folder.

LeRobot (`lerobot.datasets.compute_stats`) computes statistics per episode and aggregates them:
- per episode and numeric feature: min, max, mean and std over the episode's frames in float32
  (std from the mean of squares), quantiles q01, q10, q50, q90, q99 from a 5000-bin histogram
  between the episode's min and max (linear inside the bin), count = frames;
- per episode and camera: the same per colour channel over every pixel of a sample of the
  episode's frames (`linspace(0, n-1, k)` rounded, k = n below 100 frames, else max(100, n^0.75)
  up to 10000), each frame strided down when its longer side is >= 300 px (factor
  int(side / 150)), divided by 255, shape (3, 1, 1); count = sampled frames;
- across episodes: count-weighted mean, pooled variance, min of mins, max of maxes, and the
  count-weighted mean of each quantile (not the quantile of the whole set).
This module computes the same from the shards' frames table (numeric columns) and stored frames
(cameras), so a LeRobot policy normalises as it would with LeRobotDataset.

Where it cannot be equal: LeRobot's image statistics in a recorded dataset's stats.json come from
the camera frames before video encoding; the shards hold the decoded frames (what training sees).
Against LeRobot's algorithm run on LeRobotDataset's own decoded frames the image statistics agree
to the decoders' rounding (`tests/datakit/lerobot/test_lerobot_dataset.py` states the bound); numeric ones agree
to float32 rounding.

The camera statistics read ~100 frames per episode and camera, minutes on a large dataset, so
they are cached per conversion (`cached`: keyed by the sha256 of index.json, which names every
shard's sha256) in $XDG_CACHE_HOME/datakit/lerobot-stats (~/.cache/...), written atomically.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from datakit.durable import write_atomic

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
HIST_BINS = 5000  # LeRobot's RunningQuantileStats default
SAMPLE_MIN, SAMPLE_MAX, SAMPLE_POWER = 100, 10_000, 0.75
DOWNSAMPLE_TARGET, DOWNSAMPLE_THRESHOLD = 150, 300
CACHE_VERSION = 1  # part of the cache key: bump when what is computed changes


def vector_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """One batch's statistics over rows of (N, D) values (LeRobot's single-batch running stats)."""
    x = x.reshape(-1, x.shape[-1])
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    n = x.shape[0]
    if n < 2:  # LeRobot: quantiles fall back to the mean
        mean = x.mean(0)
        out = {"min": x.min(0), "max": x.max(0), "mean": mean, "std": x.std(0), "count": np.array([n])}
        return {**out, **{k: mean.copy() for k in QUANTILE_KEYS}}
    lo, hi = x.min(0), x.max(0)
    mean, sq = x.mean(0), (x ** 2).mean(0)
    out = {"min": lo, "max": hi, "mean": mean, "std": np.sqrt(np.maximum(0, sq - mean ** 2)), "count": np.array([n])}
    edges = [np.linspace(lo[d] - 1e-10, hi[d] + 1e-10, HIST_BINS + 1) for d in range(x.shape[1])]
    cums = [np.cumsum(np.histogram(x[:, d], bins=edges[d])[0].astype(np.float64)) for d in range(x.shape[1])]
    for q, key in zip(QUANTILES, QUANTILE_KEYS):
        out[key] = np.array([_hist_quantile(c, e, q * n) for c, e in zip(cums, edges)])
    return out


def _hist_quantile(cum: np.ndarray, edges: np.ndarray, target: float) -> float:
    """The value below which `target` of the histogram's counts lie, linear inside its bin."""
    i = int(np.searchsorted(cum, target))
    if i == 0:
        return float(edges[0])
    if i >= cum.size:
        return float(edges[-1])
    before, inside = cum[i - 1], cum[i] - cum[i - 1]
    if inside == 0:
        return float(edges[i])
    return float(edges[i] + (target - before) / inside * (edges[i + 1] - edges[i]))


def sampled_frames(length: int) -> list[int]:
    """Which frames of an episode of `length` LeRobot samples for image statistics."""
    k = max(min(SAMPLE_MIN, length), min(int(length ** SAMPLE_POWER), SAMPLE_MAX))
    return np.round(np.linspace(0, length - 1, k)).astype(int).tolist()


def downsample(chw: np.ndarray) -> np.ndarray:
    """A (C, H, W) frame strided down as LeRobot does before image statistics."""
    _, h, w = chw.shape
    if max(h, w) < DOWNSAMPLE_THRESHOLD:
        return chw
    f = int(w / DOWNSAMPLE_TARGET) if w > h else int(h / DOWNSAMPLE_TARGET)
    return chw[:, ::f, ::f]


def image_stats(frames_hwc: np.ndarray) -> dict[str, np.ndarray]:
    """One episode's camera statistics from its sampled (K, H, W, C) uint8 frames: per channel, in [0, 1]."""
    chw = np.stack([downsample(f.transpose(2, 0, 1)) for f in frames_hwc])
    k, c = chw.shape[:2]
    st = vector_stats(chw.transpose(0, 2, 3, 1).reshape(-1, c))
    return {key: (np.array([k]) if key == "count" else (v / 255.0).reshape(c, 1, 1)) for key, v in st.items()}


def aggregate(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Episode statistics of one feature combined as LeRobot's `aggregate_feature_stats` does."""
    means = np.stack([s["mean"] for s in per_episode])
    counts = np.stack([s["count"] for s in per_episode])
    total = counts.sum(0)
    w = counts.reshape(counts.shape + (1,) * (means.ndim - counts.ndim))
    mean = (means * w).sum(0) / total
    var = ((np.stack([s["std"] ** 2 for s in per_episode]) + (means - mean) ** 2) * w).sum(0) / total
    out = {"min": np.stack([s["min"] for s in per_episode]).min(0), "max": np.stack([s["max"] for s in per_episode]).max(0),
           "mean": mean, "std": np.sqrt(var), "count": total}
    for key in QUANTILE_KEYS:
        out[key] = (np.stack([s[key] for s in per_episode]) * w).sum(0) / total
    return out


def lerobot_stats(columns: dict[str, np.ndarray], episodes: Iterable[tuple[int, int]],
                  cameras: dict[str, Callable[[int], np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
    """LeRobot's aggregated statistics. `columns`: feature -> (rows, ...) values of every frame;
    `episodes`: (first row, length) of each episode; `cameras`: feature -> read(row) giving that
    row's (H, W, C) uint8 frame."""
    episodes = list(episodes)
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, col in columns.items():
        per = []
        for start, n in episodes:
            v = col[start : start + n]
            st = vector_stats(v if v.ndim > 1 else v[:, None])
            if v.ndim == 1:  # LeRobot keeps a (1,) shape for scalar features
                st = {k: (s if k == "count" else s.reshape(1)) for k, s in st.items()}
            per.append(st)
        out[key] = aggregate(per)
    for key, read in cameras.items():
        out[key] = aggregate([image_stats(np.stack([read(start + i) for i in sampled_frames(n)]))
                              for start, n in episodes])
    return out


def default_stats_dir() -> Path:
    """$XDG_CACHE_HOME/datakit/lerobot-stats, else ~/.cache/datakit/lerobot-stats."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "datakit" / "lerobot-stats"


def cached(index_json: str, compute: Callable[[], dict[str, dict[str, np.ndarray]]],
           stats_dir: Path | None) -> dict[str, dict[str, np.ndarray]]:
    """`compute()`'s statistics of the conversion whose manifest is `index_json`, from the cache in
    `stats_dir` when there (an unreadable entry is computed again); `stats_dir` None: no cache."""
    if stats_dir is None:
        return compute()
    key = hashlib.sha256(f"{CACHE_VERSION}\n{index_json}".encode()).hexdigest()
    path = Path(stats_dir) / f"{key}.json"
    try:
        return {k: {s: np.asarray(v) for s, v in st.items()} for k, st in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        pass
    stats = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({k: {s: np.asarray(v).tolist() for s, v in st.items()}
                                       for k, st in stats.items()}).encode(), durable=False)
    except OSError:
        pass  # a read-only home: no cache, the statistics are still right
    return stats

"""Normalisation statistics of state and action, per dimension, over every converted frame."""
from __future__ import annotations

import numpy as np

STAT_NAMES = ("mean", "std", "min", "max", "q01", "q99")


def vector_stats(x: np.ndarray) -> dict[str, list[float]]:
    """mean, std, min, max, 1st and 99th percentile of (N, D) values (float64 accumulation)."""
    if x.size == 0:
        return {k: [] for k in STAT_NAMES}
    x = np.asarray(x, np.float64)
    q01, q99 = np.quantile(x, [0.01, 0.99], axis=0)
    out = {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0), "q01": q01, "q99": q99}
    return {k: [float(v) for v in out[k]] for k in STAT_NAMES}

"""Normalisation statistics of state and action, per dimension, over every converted frame.

Only finite values count: a NaN or +-inf (kept with `nonfinite = "keep"`) is left out of the
statistics of its dimension and counted instead, so `index.json` always holds strict JSON."""
from __future__ import annotations

import numpy as np

STAT_NAMES = ("mean", "std", "min", "max", "q01", "q99")


def finite_vector_stats(x: np.ndarray) -> tuple[dict[str, list[float]], list[int]]:
    """Statistics of (N, D) values over the finite values of each dimension (float64
    accumulation), and per dimension the number of values left out (NaN, +-inf). A dimension
    with no finite value at all gets 0.0 for every statistic (its count says why)."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.size == 0:
        return {k: [] for k in STAT_NAMES}, [0] * (x.shape[1] if x.ndim == 2 else 0)
    finite = np.isfinite(x)
    excluded = (~finite).sum(0)
    if not excluded.any():  # the usual case: one vectorised pass
        cols = _stats(x)
    else:  # per dimension over its finite values (D is small; no slow nan-aware quantiles)
        per_dim = [_stats(x[finite[:, d], d][:, None]) for d in range(x.shape[1])]
        cols = {k: np.concatenate([p[k] for p in per_dim]) for k in STAT_NAMES}
    return ({k: [float(v) if np.isfinite(v) else 0.0 for v in cols[k]] for k in STAT_NAMES},
            [int(c) for c in excluded])


def _stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Every statistic of finite (N, D) float64 values; NaN for N == 0 (the caller writes 0.0)."""
    if len(x) == 0:
        return {k: np.full(x.shape[1], np.nan) for k in STAT_NAMES}
    q01, q99 = np.quantile(x, [0.01, 0.99], axis=0)
    return {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0), "q01": q01, "q99": q99}


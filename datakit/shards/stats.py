"""Normalisation statistics of state and action, per dimension, over every converted frame.

Only finite values count: a NaN or +-inf (kept with `nonfinite = "keep"`) is left out of the
statistics of its dimension and counted instead, so `index.json` always holds strict JSON."""
from __future__ import annotations

import warnings

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
    masked = np.where(finite, x, np.nan)
    with warnings.catch_warnings():  # an all-NaN dimension: filled with 0.0 below
        warnings.simplefilter("ignore", RuntimeWarning)
        q01, q99 = np.nanquantile(masked, [0.01, 0.99], axis=0)
        out = {"mean": np.nanmean(masked, 0), "std": np.nanstd(masked, 0), "min": np.nanmin(masked, 0),
               "max": np.nanmax(masked, 0), "q01": q01, "q99": q99}
    return ({k: [float(v) if np.isfinite(v) else 0.0 for v in out[k]] for k in STAT_NAMES},
            [int(c) for c in excluded])


def vector_stats(x: np.ndarray) -> dict[str, list[float]]:
    """mean, std, min, max, 1st and 99th percentile of (N, D) values over finite values only
    (see `finite_vector_stats` for the counts of values left out)."""
    return finite_vector_stats(x)[0]

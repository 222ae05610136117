"""Backends compared with each other: PSNR of the same frames decoded by different libraries.

The barcode check proves each decoder returned the right frame; this one shows whether they
agree on its pixels. FFmpeg-based libraries can still differ in colour conversion (BT.601 vs
BT.709 matrices, limited vs full range) and scaling, which a model trained on one and served
with another would see. Identical conversion gives inf (or > 50 dB); below ~30 dB the
libraries disagree visibly, and the report says so.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

DISAGREE_DB = 30.0


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return 0.0
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _load(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError):
        return None


def compare(probes: dict[tuple[str, str], Path], reference_order: tuple[str, ...] = ("pyav",)) -> list[dict]:
    """`probes` maps (video, decoder) to the frames it saved. For each video the reference is
    the first decoder of `reference_order` that saved frames (else the first one that did)."""
    out = []
    videos = list(dict.fromkeys(v for v, _ in probes))
    for video in videos:
        frames = {d: f for (v, d), p in probes.items() if v == video and (f := _load(p)) is not None}
        if len(frames) < 2:
            continue
        ref = next((d for d in reference_order if d in frames), next(iter(frames)))
        for d, f in frames.items():
            if d == ref:
                continue
            common = sorted(set(f) & set(frames[ref]), key=int)
            if not common:
                continue
            val = min(psnr(f[k], frames[ref][k]) for k in common)
            out.append({"video": video, "decoder": d, "reference": ref, "frames": len(common),
                        "psnr_db": None if math.isinf(val) else round(val, 2), "identical": math.isinf(val),
                        "disagree": val < DISAGREE_DB})
    return out

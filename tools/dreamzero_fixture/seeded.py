"""Seeded tensors that any torch/numpy version reproduces bit for bit: the weights and inputs of the
DreamZero Level-2 fixtures (tests/assets/dreamzero_fixture_*.json, written by make_fixture.py here and
read by tests/trainkit/models/dreamzero/test_dreamzero_fixture.py, which loads this file by path).

A tensor is named; its values are SplitMix64 over the counter 1..n from the seed
`seed * 2^32 + crc32(name)`, the top 53 bits mapped to u in [-1, 1), then `offset + scale * u`
rounded to float32. Integer arithmetic only (numpy uint64, wrapping), so no RNG stream of torch or
numpy is involved: the fixture stores a seed instead of 1.7M parameters (the official image
projection is 1280 x 1280 whatever the width).
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def uniform(seed: int, name: str, n: int) -> np.ndarray:
    """(n,) float64 in [-1, 1), a pure function of (seed, name, n)."""
    start = np.uint64((seed << 32) + zlib.crc32(name.encode()))
    with np.errstate(over="ignore"):
        z = (start + np.arange(1, n + 1, dtype=np.uint64)) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0


def tensor(seed: int, name: str, shape: list[int] | tuple[int, ...], scale: float, offset: float = 0.0) -> torch.Tensor:
    """float32 tensor `offset + scale * uniform(seed, name)` of `shape`."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    values = (offset + scale * uniform(seed, name, n)).astype(np.float32)
    return torch.from_numpy(values).reshape(tuple(shape))

"""Pi0.5's flow-time embedding is computed in float64, as LeRobot and openpi compute it (issue 17):
the oracle is openpi's `create_sinusoidal_pos_embedding` written out in numpy float64."""
import math

import numpy as np
import torch

from trainkit.models.pi05.model import time_features


def test_time_features_equal_a_float64_sincos_at_full_width():
    t = torch.tensor([0.001, 0.0371, 0.5, 0.83, 1.0], dtype=torch.float32)
    dim, lo, hi = 1024, 4e-3, 4.0
    period = lo * (hi / lo) ** np.linspace(0.0, 1.0, dim // 2, dtype=np.float64)
    angle = (1.0 / period * 2 * math.pi)[None, :] * t.double().numpy()[:, None]
    want = np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(np.float32)
    got = time_features(t, dim)
    assert got.dtype == torch.float32
    assert np.abs(got.numpy() - want).max() <= 1e-7  # float32 rounding of the same float64 numbers

"""DreamZero's discrete flow-matching schedule (its `FlowMatchScheduler(shift=5, sigma_min=0,
extra_one_step=True)` after `set_timesteps(1000, training=True)`), as three tables over the step id:

    sigma(i)    = shift s / (1 + (shift - 1) s),  s = linspace(1, 0, N + 1)[i]   (i = 0 .. N - 1)
    timestep(i) = N sigma(i)                       (what the DiT's time embedding reads)
    weight(i)   = y(i) - min y, scaled to mean 1,  y = exp(-2 ((timestep - N/2) / N)^2)

A training sample draws one step id per latent frame (uniform over 0 .. N - 1), the frames of a
block share the id of the block's first frame, and the block's actions and states take the block's
id; x_t = (1 - sigma) x + sigma noise, target noise - x; each frame's (and action's) MSE is
multiplied by weight(id).
"""
from __future__ import annotations

import torch


def sigmas(steps: int, shift: float) -> torch.Tensor:
    """(steps,) float64, from 1 down to the smallest sigma above 0."""
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)[:-1]
    return shift * s / (1 + (shift - 1) * s)


def timesteps(steps: int, shift: float) -> torch.Tensor:
    return sigmas(steps, shift) * steps


def weights(steps: int, shift: float) -> torch.Tensor:
    """(steps,) float64 training weight per step id (mean 1)."""
    y = torch.exp(-2 * ((timesteps(steps, shift) - steps / 2) / steps) ** 2)
    y = y - y.min()
    return y * (steps / y.sum())


def block_ids(ids: torch.Tensor, frames_per_block: int) -> torch.Tensor:
    """(B, latent frames) step ids with each block's frames set to the id of its first frame
    (frame 0, the conditioning frame, keeps its own)."""
    b, f = ids.shape
    blocks = ids[:, 1:].view(b, -1, frames_per_block)[:, :, :1].expand(-1, -1, frames_per_block)
    return torch.cat([ids[:, :1], blocks.reshape(b, f - 1)], dim=1)

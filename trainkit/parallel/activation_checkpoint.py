"""Activation checkpointing (recompute) with a stride per block list.

`ac_stride = {lm_layers = 1, vision_blocks = 4}` wraps every LM layer and vision blocks 0, 4,
8, ...: their activations are dropped after forward and recomputed in backward. A stride trades
memory for about a third more compute on the wrapped blocks; once per-block FSDP has freed
memory, a sparser stride (or none) is the usual win. Blocks are wrapped in place in their
ModuleList, so compile and FSDP applied afterwards see the wrapper (torchtitan's order).
A model whose blocks draw random numbers in forward (dropout: `model.recompute_rng` True) has the
RNG state saved with each wrapped block and restored for its recompute, so backward sees the
forward's dropout masks; other models skip that save (CUDA graphs capture them with AC).
"""
from __future__ import annotations

import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper


def recompute_indices(n_blocks: int, every: int) -> list[int]:
    """The blocks a stride recomputes: 0, every, 2 x every, ... (none for 0)."""
    return list(range(0, n_blocks, every)) if every else []


def apply_ac(model: nn.Module, stride: dict[str, int]) -> dict[str, list[int]]:
    """Wrap every `stride[name]`-th block of each named block list; returns the wrapped indices."""
    rng = bool(getattr(model, "recompute_rng", False))
    wrapped: dict[str, list[int]] = {}
    for name, every in stride.items():
        blocks: nn.ModuleList = getattr(model, name)
        wrapped[name] = recompute_indices(len(blocks), every)
        for i in wrapped[name]:
            blocks[i] = checkpoint_wrapper(blocks[i], preserve_rng_state=rng)
    return wrapped

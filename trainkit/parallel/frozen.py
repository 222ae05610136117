"""Frozen parameters kept out of FSDP's per-step work: replicated in the compute dtype.

A frozen parameter (requires_grad False: a family's frozen block lists and its root's frozen parts)
needs no gradient, no optimiser state and no reduce; its module runs under no_grad (the model's
job), so nothing is saved for backward and nothing is recomputed. FSDP2 would still all-gather and
cast it every step: with `parallel.frozen = "shard"` every frozen unit costs an all-gather and a
per-parameter bf16 copy-in per forward (GR00T N1.6 has 1.34B frozen parameters; the probe of
issue 16, all of them in FSDP2 units, makes ~2,900 copy_ calls a step). `"replicate"` takes them
out of FSDP (`fully_shard(ignored_params=)`), casts them once to the compute dtype, and keeps a
whole copy on every rank: 2 bytes per frozen parameter per GPU (2.7 GB for N1.6), no collective
and no copy per step. It is applied on the meta device, so the parameters are materialised and
initialised in that dtype.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def frozen_params(model: nn.Module) -> set[nn.Parameter]:
    """Every parameter that does not train."""
    return {p for p in model.parameters() if not p.requires_grad}


def frozen_lists(model: nn.Module, block_lists: tuple[str, ...]) -> tuple[str, ...]:
    """The block lists none of whose parameters trains."""
    return tuple(name for name in block_lists
                 if not any(p.requires_grad for p in getattr(model, name).parameters()))


def replicate_frozen(model: nn.Module, dtype: torch.dtype) -> set[nn.Parameter]:
    """Cast the frozen parameters to `dtype` in place; returns them (FSDP's ignored set)."""
    frozen = frozen_params(model)
    for p in frozen:
        p.data = p.data.to(dtype)
    return frozen

"""FSDP2 wrapping: one unit per group of blocks, then the root; explicit prefetch between units.

Unit count decides how many all-gathers a step issues and how much of the model is
materialised at once. `fsdp = "root"` is one unit: the whole model is all-gathered before
forward and nothing overlaps with compute (the baseline). `fsdp = "block"` makes each group of
`group[name]` consecutive blocks one unit (`fully_shard` on a list of modules shares one
all-gather), plus the root for the remaining parameters (embeddings, projector, heads).
Small blocks (SigLIP's 1152-wide ones) are grouped so each all-gather is large enough to run at
link speed; the 2048-wide LM layers are one unit each.

Per step, with U block units and reshard-after-forward: U + 1 all-gathers in forward (the
root's parameters stay gathered, FSDP2 does not reshard the root after forward) and U again
in backward, so 2U + 1; the root alone gives 1. A frozen unit (parallel.frozen = "shard") runs
under no_grad: it is gathered in forward only (`set_unshard_in_backward(False)`, so no prefetch
gathers it for a backward it does not have). Without resharding after forward the units
keep their gathered parameters until their backward: U + 1, at the cost of holding every
block's bf16 parameters at the forward/backward turn (~6.5 GB at the full preset).

Prefetch: each unit's forward all-gather is issued when the previous unit starts (forward
prefetch) and, in backward, the unit before it in forward order is gathered while this one
computes (backward prefetch). FSDP2 does both implicitly for the next unit it can infer; the
explicit lists make the order independent of module registration and cross block lists
(the last vision unit prefetches the first LM layer).
"""
from __future__ import annotations

from typing import Any

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def fsdp_mode(cfg: Any, world_size: int) -> str:
    """The FSDP mode a run applies: `parallel.fsdp`, but none on one rank without
    `parallel.fsdp_one_rank` (parallelize, and the memory estimate's inputs, read it here)."""
    return "none" if world_size == 1 and not getattr(cfg, "fsdp_one_rank", True) else cfg.fsdp


def apply_fsdp(model: nn.Module, mode: str, block_lists: tuple[str, ...], group: dict[str, int],
               mp: MixedPrecisionPolicy, reshard_after_forward: bool = True,
               ignored: set[nn.Parameter] | None = None) -> list[FSDPModule]:
    """Shard `model` in place; returns the block units in forward order (empty for "root").
    `ignored`: parameters FSDP leaves alone (replicated frozen ones, parallel/frozen.py); a block
    list made of them alone gets no unit."""
    units: list[FSDPModule] = []
    ignored = ignored or set()
    if mode == "block":
        for name in block_lists:
            blocks = list(getattr(model, name))
            if all(p in ignored for p in getattr(model, name).parameters()):
                continue
            g = group.get(name, 1)
            for i in range(0, len(blocks), g):
                chunk = blocks[i : i + g]
                unit = fully_shard(chunk if len(chunk) > 1 else chunk[0], mp_policy=mp,
                                   reshard_after_forward=reshard_after_forward, ignored_params=ignored or None)
                if not any(p.requires_grad for m in chunk for p in m.parameters()):
                    # frozen: runs under no_grad, so backward never needs it; without this FSDP2's
                    # (implicit or explicit) backward prefetch would gather it again for nothing
                    (unit[0] if isinstance(unit, list) else unit).set_unshard_in_backward(False)
                units.append(chunk[0])  # any module of a grouped unit addresses the shared state
    fully_shard(model, mp_policy=mp, ignored_params=ignored or None)
    return units


def apply_prefetch(units: list[FSDPModule]) -> None:
    """Unit i prefetches unit i+1 in forward and unit i-1 in backward."""
    for i, unit in enumerate(units):
        if i + 1 < len(units):
            unit.set_modules_to_forward_prefetch([units[i + 1]])
        if i > 0:
            unit.set_modules_to_backward_prefetch([units[i - 1]])


def all_gathers_per_step(mode: str, num_units: int, reshard_after_forward: bool = True, *, world_size: int,
                         frozen_units: int = 0) -> int:
    """All-gathers one forward + backward issues: 1 (2 when resharded after forward) per block
    unit + 1 for the root; a frozen unit (run under no_grad: no backward) gathers once. None on
    one rank, where FSDP2 keeps the whole parameters and issues no collective (it checks the
    group size before every all-gather and reduce-scatter)."""
    if mode == "none" or world_size == 1:
        return 0
    return (2 if reshard_after_forward else 1) * (num_units - frozen_units) + frozen_units + 1

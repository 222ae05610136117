"""The per-GPU peak memory of a training step: what `trainkit inspect` reports and `trainkit tune`
prunes by. Pure arithmetic on counts taken from a model built on the meta device.

The peak is at the turn from forward to backward: every saved activation is alive, the last
block's backward has begun, and no gradient exists yet (the trainer drops them with
`zero_grad(set_to_none=True)` every step, and in backward they appear as activations are freed).
The one-GPU run in bench/results/memory.md shows it: world size 1 adds exactly the 12 bytes per
parameter of fp32 weights and AdamW states that sharding over 2 GPUs saved, not 16. So the peak is

    fp32 parameters + AdamW m and v (12 B/param, sharded over the world size)
    + fp32 gradients, only under gradient accumulation (they live across micro-batches)
    + gathered parameters in param_dtype (the FSDP units alive at the turn, `gathered_params`)
    + saved activations: inputs of recomputed blocks as counted; the rest (blocks, root) as the
      family's eager count (`Family.activations`) x its measured ratio, compiled or eager
    + the block in backward: its gradient temporaries, its full eager set x `backward_block`;
      when recompute makes a block deeper in backward the fuller moment (its forward run again
      while the blocks before it still hold theirs), that moment instead (`saved_elements`)

with the ratios from the family's record (`Family.memory`, fitted to measured peaks). It counts
what torch.cuda.max_memory_allocated counts; the caching allocator's reserve beyond that is not
in it (expandable segments moved the allocated peak by 0.2%: 100.47 vs 100.69 GiB).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from trainkit.models.family import Activations, MemoryCalibration
from trainkit.parallel.activation_checkpoint import recompute_indices

GIB = 2 ** 30


def block_params(model: nn.Module) -> dict[str, list[int]]:
    """Parameter count of every block, per block list of the model's BLOCK_LISTS."""
    return {name: [sum(p.numel() for p in block.parameters()) for block in getattr(model, name)]
            for name in model.BLOCK_LISTS}


def unit_sizes(blocks: Mapping[str, list[int]], total: int, mode: str,
               group: Mapping[str, int]) -> tuple[list[int], int]:
    """Parameter counts of the FSDP block units (forward order) and of the root unit."""
    if mode != "block":
        return [], total
    units = [sum(sizes[i:i + group.get(name, 1)]) for name, sizes in blocks.items()
             for i in range(0, len(sizes), group.get(name, 1))]
    return units, total - sum(units)


def gathered_params(total: int, units: list[int], root: int, mode: str, reshard: bool, act_bytes: int) -> int:
    """Parameters held in param_dtype at the turn: the root plus the unit computing and the one
    prefetched ("block"), every unit (without reshard_after_forward, or "root"), or without FSDP
    autocast's cached low-precision copy of every weight (none in float32)."""
    if mode == "block":
        return total if not reshard else root + 2 * max(units, default=0)
    if mode == "root":
        return total
    return total if act_bytes < 4 else 0


def recompute_map(blocks: Mapping[str, list[int]], stride: Mapping[str, int]) -> dict[str, list[int]]:
    """Recomputed block indices per block list of `block_params` (parallel/checkpointing's rule)."""
    return {name: recompute_indices(len(sizes), stride.get(name, 0)) for name, sizes in blocks.items()}


def saved_elements(table: Activations, recompute: Mapping[str, list[int]], block_ratio: float = 1.0,
                   root_ratio: float = 1.0, backward: float = 1.0) -> tuple[float, float]:
    """Per sample: (elements saved at the forward/backward turn; the most alive at once in backward).

    A block keeps its count x `block_ratio`, or only its input when recomputed; the root keeps its
    count x `root_ratio`. Backward runs the blocks in reverse forward order (the table's): at block
    j the blocks before it still hold what they kept, block j holds its full set (saved, or
    recomputed now from its kept input, which that set includes) and its gradient temporaries, its
    full eager set x `backward`; blocks after j are freed. So recomputing more blocks never raises
    either figure."""
    before, most = root_ratio * table.root, 0.0
    for name, blocks in table.blocks.items():
        for i, (full, kept_input) in enumerate(blocks):
            rerun = i in recompute.get(name, ())
            most = max(most, before + (block_ratio + backward) * full)
            before += kept_input if rerun else block_ratio * full
    return before, max(most, before)


def estimate(*, total: int, trainable: int, gathered: int, table: Activations, recompute: Mapping[str, list[int]],
             micro: int, world: int, sharded: bool, act_bytes: int, compiled: bool, accum: int,
             calib: MemoryCalibration, replicated: int = 0) -> dict[str, Any]:
    """The peak's parts in GiB (their sum is `peak_gib`), and the saved activations the same
    micro-batch would keep with no / every block recomputed. `replicated`: frozen parameters of
    `total` held whole on every rank in param_dtype, out of FSDP (parallel/frozen.py)."""
    sharded_total = total - replicated
    shard, trained = (sharded_total / world, trainable / world) if sharded else (sharded_total, trainable)
    ratio = calib.saved_compiled if compiled else calib.saved_eager
    per = act_bytes * micro / GIB  # GiB per element of one sample, times the micro-batch

    def saved(rec: Mapping[str, list[int]]) -> tuple[float, float]:
        return saved_elements(table, rec, ratio, calib.saved_eager, calib.backward_block)  # the root is never compiled

    kept, most = saved(recompute)
    parts = {"params_gib": (4 * shard + act_bytes * replicated) / GIB, "optimizer_gib": 8 * trained / GIB,
             "grads_gib": 4 * trained / GIB if accum > 1 else 0.0,
             "gathered_params_gib": act_bytes * gathered / GIB, "activations_gib": kept * per,
             "backward_transient_gib": (most - kept) * per}
    every = {name: list(range(len(blocks))) for name, blocks in table.blocks.items()}
    # rounded to 1 KiB, so a tiny preset's parts keep their digits
    return {**{k: round(v, 6) for k, v in parts.items()}, "peak_gib": round(sum(parts.values()), 6),
            "activations_no_recompute_gib": round(saved({})[0] * per, 6),
            "activations_full_recompute_gib": round(saved(every)[0] * per, 6)}


def dynamic_gib(parts: Mapping[str, float]) -> float:
    """The part of an estimate that scales with the micro-batch (what a measured run corrects)."""
    return parts["activations_gib"] + parts["backward_transient_gib"]

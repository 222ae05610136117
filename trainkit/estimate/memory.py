"""The per-GPU peak memory of a training step: what `trainkit inspect` reports and `trainkit tune`
prunes by. Pure arithmetic on counts taken from a model built on the meta device.

The peak is at the turn from forward to backward: every saved activation is alive, the last
block's backward has begun, and no gradient exists yet (the trainer drops them with
`zero_grad(set_to_none=True)` every step, and in backward they appear as activations are freed).
The one-GPU run in bench/results/memory.md shows it: world size 1 adds exactly the 12 bytes per
parameter of fp32 weights and AdamW states that sharding over 2 GPUs saved, not 16. So the peak is

    fp32 parameters + AdamW m and v (12 B/param, sharded over the world size; + 4 B for the weight EMA)
    + fp32 gradients, only under gradient accumulation (they live across micro-batches)
    + gathered parameters in param_dtype (the FSDP units alive at the turn, `gathered_params`)
    + saved activations: inputs of recomputed blocks as counted; the rest (blocks, root) as the
      family's eager count (`Family.activations`) x its measured ratio, compiled or eager
    + the block in backward: its gradient temporaries, its full eager set x `backward_block`;
      when recompute makes a block deeper in backward the fuller moment (its forward run again
      while the blocks before it still hold theirs), that moment instead (`saved_elements`)

with the ratios from the family's record (`Family.memory`, fitted to measured peaks).

That turn is the peak when activations dominate (pi05 at every measured setting). When they do
not (GR00T: 1.3B trained parameters, small activations; any run with every block recomputed),
the peak is one of two later moments, and the estimate is the largest of the three (`moment`):

- **a reduce-scatter** (`reduce_moments`, FSDP only): FSDP2 reduces each unit's gradients right
  after its backward, in reverse forward order, the root last. While unit u reduces, alive are
  the weights and AdamW states, the fp32 gradients of the units already reduced (after u in
  forward order), the activations the blocks before u still keep, the gathered root and the unit
  prefetched for the next backward, and u's reduce buffers (`reduce_buffers`): FSDP2's
  reduce-scatter input in reduce_dtype (4 B per trained parameter of u, unsharded) beside either
  u's unsharded param_dtype gradients (the copy-in) or its reduce-scatter output (4 B / world
  size): 8 B per trained parameter at world size 1. With one root unit this is the peak of a
  recompute-everything run: GR00T's baseline 29.30 GiB estimated vs 29.45 measured, DreamZero's
  93.59 vs 93.74, where the turn says 25.6 and 67.8.
- **the optimiser step**: weights, AdamW states and every fp32 gradient (16 B per trained
  parameter, sharded), nothing else. CUDA graphs make it the peak at small micro-batches: a
  replay allocates nothing, so the graphed run's peaks are those of its capture at step 0 (before
  AdamW has states: its zero gradients and their saved copy, parallel/cudagraphs.py, take the
  states' 8 bytes) and this step (GR00T at micro-batch 16: 21.94 GiB estimated, 22.19 measured,
  the same at horizon 16 and 50). The capture keeps no gradient of a reduced unit beyond those
  (`graphs`); gradient accumulation keeps every one (`accum`).

These two moments add no constant: their bytes are counted (only the activations the blocks
still keep at a reduce-scatter take the family's ratio, as at the turn). The estimate counts what
torch.cuda.max_memory_allocated counts; the caching allocator's reserve beyond that is not in it
(expandable segments moved the allocated peak by 0.2%: 100.47 vs 100.69 GiB), nor the CUDA
context: a run out of memory may have allocated somewhat less than the GPU has.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from trainkit.models.family import Activations, MemoryCalibration
from trainkit.parallel.activation_checkpoint import recompute_indices

GIB = 2 ** 30


def block_params(model: nn.Module, trained: bool = False) -> dict[str, list[int]]:
    """Parameter count of every block (`trained`: of its trained parameters), per block list of
    the model's BLOCK_LISTS."""
    return {name: [sum(p.numel() for p in block.parameters() if p.requires_grad or not trained)
                   for block in getattr(model, name)] for name in model.BLOCK_LISTS}


@dataclass(frozen=True)
class Unit:
    """One FSDP unit, as its reduce-scatter sees it."""

    params: int  # parameters it all-gathers in param_dtype
    trained: int  # of them trained: the gradients it reduce-scatters
    first: int = 0  # forward position of its first block, over the activation table's blocks in order (root: 0)


def fsdp_units(table: Activations, blocks: Mapping[str, list[int]], trained: Mapping[str, list[int]], total: int,
               trainable: int, mode: str, group: Mapping[str, int], skip: Sequence[str] = ()) -> tuple[list[Unit], Unit | None]:
    """The block units in forward order (mode "block") and the root unit (None without FSDP), from
    `block_params` of all and of the trained parameters; `total` and `trainable` count what FSDP
    holds (replicated frozen parameters left out), `skip`: the block lists it holds none of."""
    if mode == "none":
        return [], None
    position, start = {}, 0
    for name, rows in table.blocks.items():
        position[name], start = start, start + len(rows)
    units = [] if mode != "block" else [
        Unit(params=sum(sizes[i:i + group.get(name, 1)]), trained=sum(trained[name][i:i + group.get(name, 1)]),
             first=position.get(name, 0) + i)
        for name, sizes in blocks.items() if name not in skip for i in range(0, len(sizes), group.get(name, 1))]
    root = Unit(params=total - sum(u.params for u in units), trained=trainable - sum(u.trained for u in units))
    return units, root


def unit_sizes(blocks: Mapping[str, list[int]], total: int, mode: str,
               group: Mapping[str, int]) -> tuple[list[int], int]:
    """Parameter counts of the FSDP block units (forward order) and of the root unit."""
    if mode != "block":
        return [], total
    units = [sum(sizes[i:i + group.get(name, 1)]) for name, sizes in blocks.items()
             for i in range(0, len(sizes), group.get(name, 1))]
    return units, total - sum(units)


def gathered_params(total: int, units: list[int], root: int, mode: str, reshard: bool, act_bytes: int,
                    autocast_copy: float = 1.0) -> int:
    """Parameters held in param_dtype at the turn: the root plus the unit computing and the one
    prefetched ("block"), every unit (without reshard_after_forward, or "root"), or without FSDP
    autocast's low-precision copy of the weights (none in float32), `autocast_copy` of them (the
    family's calibration: compiled blocks keep fewer than eager autocast's cache)."""
    if mode == "block":
        return total if not reshard else root + 2 * max(units, default=0)
    if mode == "root":
        return total
    return round(total * autocast_copy) if act_bytes < 4 else 0


def with_terms(table: Activations, terms: Mapping[str, Mapping[str, Sequence[float]]],
               coefficients: Mapping[str, float]) -> Activations:
    """The table with each switchable term (`Family.memory_terms`: elements per block of one sample,
    eager) x its fitted coefficient (absent: 1.0) added to the blocks' full sets; a recomputed
    block still keeps only its input. Terms are how a config switch that swaps a kernel (masked vs
    varlen attention, bf16 vs FP8 linears) changes what a block saves."""
    blocks = {name: [(full + sum(coefficients.get(t, 1.0) * rows[name][i] for t, rows in terms.items() if name in rows),
                      kept_input) for i, (full, kept_input) in enumerate(sizes)]
              for name, sizes in table.blocks.items()}
    return Activations(blocks=blocks, root=table.root)


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


def kept_elements(table: Activations, recompute: Mapping[str, list[int]], block_ratio: float = 1.0,
                  root_ratio: float = 1.0) -> list[float]:
    """Per sample, kept[k]: the elements the root and the first k blocks (forward order) keep for
    backward, as `saved_elements` counts them (a recomputed block keeps its input)."""
    kept = [root_ratio * table.root]
    for name, blocks in table.blocks.items():
        for i, (full, kept_input) in enumerate(blocks):
            kept.append(kept[-1] + (kept_input if i in recompute.get(name, ()) else block_ratio * full))
    return kept


def reduce_buffers(trained: int, world: int, act_bytes: int, reduce_bytes: int = 4) -> float:
    """Bytes a unit's reduce-scatter holds (torch's fsdp foreach_reduce): its input in reduce_dtype,
    unsharded, beside the unit's param_dtype gradients during the copy-in, then beside its output
    (the unit's sharded gradients: 1 / world of the input)."""
    return trained * (reduce_bytes + max(act_bytes, reduce_bytes / world))


def reduce_moments(units: Sequence[Unit], root: Unit, kept: Sequence[float], *, world: int, act_bytes: int,
                   reshard: bool, grads: str = "reduced", reduce_bytes: int = 4) -> list[dict[str, float]]:
    """Each unit's reduce-scatter, in backward order (the block units in reverse, the root last):
    {"grads": bytes of fp32 gradients alive, "gathered": parameters gathered, "kept": elements kept
    per sample, "buffers": bytes of its reduce buffers}. `grads`: "reduced" (those of the units
    reduced before it), "all" (accumulated over micro-batches) or "none" (a CUDA graph's capture,
    module docstring). A frozen unit reduces nothing; in backward only trained units are gathered
    again (parallel/fsdp.py), one ahead with reshard_after_forward, else every unit before it stays."""
    total_trained = sum(u.trained for u in units) + root.trained
    out, done = [], 0
    for i in range(len(units) - 1, -1, -1):
        u = units[i]
        if not u.trained:
            continue
        ahead = next((v.params for v in reversed(units[:i]) if v.trained), 0) if reshard else sum(v.params for v in units[:i])
        alive = {"reduced": done, "all": total_trained, "none": 0}[grads]
        out.append({"grads": 4 * alive / world, "gathered": root.params + ahead, "kept": kept[u.first],
                    "buffers": reduce_buffers(u.trained, world, act_bytes, reduce_bytes)})
        done += u.trained
    if root.trained:  # after the whole backward: every activation freed, every unit resharded
        alive = {"reduced": done, "all": total_trained, "none": 0}[grads]
        out.append({"grads": 4 * alive / world, "gathered": 0, "kept": 0.0,
                    "buffers": reduce_buffers(root.trained, world, act_bytes, reduce_bytes)})
    return out


ZERO = {"grads_gib": 0.0, "gathered_params_gib": 0.0, "activations_gib": 0.0, "reduce_buffers_gib": 0.0}


def later_moments(*, trained: float, units: Sequence[Unit], root: Unit | None, kept: Sequence[float], per: float,
                  world: int, act_bytes: int, reshard: bool, accum: int, graphs: bool,
                  reduce_bytes: int = 4) -> dict[str, dict[str, float]]:
    """The parts (GiB, beyond weights and AdamW states) of the fullest reduce-scatter (FSDP only)
    and of the optimiser step (module docstring); `trained`: trained parameters on this rank,
    `per`: GiB per kept element of one sample times the micro-batch."""
    out = {}
    if root is not None:
        grads = "all" if accum > 1 else "none" if graphs else "reduced"
        reduces = [{**ZERO, "grads_gib": r["grads"] / GIB, "gathered_params_gib": act_bytes * r["gathered"] / GIB,
                    "activations_gib": r["kept"] * per, "reduce_buffers_gib": r["buffers"] / GIB}
                   for r in reduce_moments(units, root, kept, world=world, act_bytes=act_bytes, reshard=reshard,
                                           grads=grads, reduce_bytes=reduce_bytes)]
        if reduces:
            out["reduce"] = max(reduces, key=lambda p: sum(p.values()))
    out["optimizer_step"] = {**ZERO, "grads_gib": 4 * trained / GIB}
    return out


def estimate(*, total: int, trainable: int, gathered: int, table: Activations, recompute: Mapping[str, list[int]],
             micro: int, world: int, sharded: bool, act_bytes: int, compiled: bool, accum: int,
             calib: MemoryCalibration, replicated: int = 0, units: Sequence[Unit] = (), root: Unit | None = None,
             reshard: bool = True, graphs: bool = False, reduce_bytes: int = 4, ema: bool = False,
             zeroed_graph_grads: bool = False) -> dict[str, Any]:
    """The parts of the turn in GiB (params_gib .. backward_transient_gib, their sum `turn_gib`),
    the later moments' parts (`later`: "reduce", "optimizer_step", each with its `peak_gib`), the
    peak (`peak_gib`, the largest moment, named by `moment`) and its part that scales with the
    micro-batch (`dynamic_gib`), and the saved activations the same micro-batch would keep with no
    / every block recomputed. `replicated`: frozen parameters of `total` held whole on every rank
    in param_dtype, out of FSDP (parallel/frozen.py). `units`, `root`: the FSDP units
    (`fsdp_units`; root None without FSDP: no reduce-scatter). `ema`: train.ema_decay > 0, whose fp32
    average of the trained parameters (optim/ema.py) lives beside AdamW's states, counted with them.
    `zeroed_graph_grads`: a CUDA graph without FSDP or accumulation that adds into zeroed gradients
    (parallel.graph_grads = "zeroed"): they live through the forward, and the graph's pool holds as
    much again (GR00T N1.7 at micro-batch 128 on one H100: 40.08 GiB against 30.39 with owned
    gradients, 9.69 = 2 x 4.84 GiB of fp32 gradients): 8 bytes per trained parameter at the turn."""
    sharded_total = total - replicated
    shard, trained = (sharded_total / world, trainable / world) if sharded else (sharded_total, trainable)
    ratio = calib.saved_compiled if compiled else calib.saved_eager
    per = act_bytes * micro / GIB  # GiB per element of one sample, times the micro-batch

    def saved(rec: Mapping[str, list[int]]) -> tuple[float, float]:
        return saved_elements(table, rec, ratio, calib.saved_eager, calib.backward_block)  # the root is never compiled

    kept, most = saved(recompute)
    parts = {"params_gib": (4 * shard + act_bytes * replicated) / GIB, "optimizer_gib": (12 if ema else 8) * trained / GIB,
             "grads_gib": 4 * trained / GIB if accum > 1 else 8 * trained / GIB if zeroed_graph_grads else 0.0,
             "gathered_params_gib": act_bytes * gathered / GIB, "activations_gib": kept * per,
             "backward_transient_gib": (most - kept) * per}
    static = parts["params_gib"] + parts["optimizer_gib"]
    later = later_moments(trained=trained, units=units, root=root, kept=kept_elements(table, recompute, ratio, calib.saved_eager),
                          per=per, world=world, act_bytes=act_bytes, reshard=reshard, accum=accum, graphs=graphs,
                          reduce_bytes=reduce_bytes)
    turn = sum(parts.values())
    peaks = {"turn": turn, **{k: static + sum(v.values()) for k, v in later.items()}}
    moment = max(peaks, key=peaks.get)  # the turn on a tie (first listed)
    dynamic = (parts["activations_gib"] + parts["backward_transient_gib"] if moment == "turn"
               else later[moment]["activations_gib"])
    every = {name: list(range(len(blocks))) for name, blocks in table.blocks.items()}
    # rounded to 1 KiB, so a tiny preset's parts keep their digits
    return {**{k: round(v, 6) for k, v in parts.items()}, "turn_gib": round(turn, 6),
            "peak_gib": round(peaks[moment], 6), "moment": moment, "dynamic_gib": round(dynamic, 6),
            "later": {k: {**{p: round(x, 6) for p, x in v.items() if x}, "peak_gib": round(peaks[k], 6)}
                      for k, v in later.items()},
            "activations_no_recompute_gib": round(saved({})[0] * per, 6),
            "activations_full_recompute_gib": round(saved(every)[0] * per, 6)}


def dynamic_gib(parts: Mapping[str, Any]) -> float:
    """The part of an estimate's peak that scales with the micro-batch (what a measured run corrects):
    the turn's activations and backward transient, or what a later moment still keeps."""
    return parts["dynamic_gib"]

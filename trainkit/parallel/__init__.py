"""parallelize(): the one place that applies the optimisations to a built model, in this order.

    plan = parallelize(model, cfg.parallel, device)   # after build on meta, before to_empty

The order matters and is torchtitan's (`parallelize_llama`), with frozen parameters first:
0. frozen parameters (requires_grad False) replicated in the compute dtype, out of FSDP
   (`parallel.frozen = "replicate"`, frozen.py), so the later steps leave them alone; then the
   model changes that swap modules or functions (mask-free joint attention, FP8 linears), so that
   recompute, compile and FSDP wrap what will run (torchtitan's model converters);
1. activation checkpointing wraps blocks first, so recompute covers exactly the block (never a
   frozen block: it runs under no_grad and keeps nothing to recompute);
2. torch.compile each (wrapped) block, so the compiled graph contains the checkpoint region
   and FSDP's hooks around blocks stay outside the graphs;
3. FSDP2 per block group, then the root, with the mixed-precision policy;
4. explicit prefetch between the units FSDP just created;
5. CUDA graphs: recorded in the plan; the trainer's micro-step captures forward + backward of a
   micro-batch, FSDP2's hooks and collectives inside (cudagraphs.py says exactly what).
Fused AdamW (optim/optimizer.py) and expandable segments (allocator.py) are applied by the trainer where
they belong: after parallelize, and before the first CUDA allocation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from trainkit.config import ParallelConfig
from trainkit.errors import ConfigError
from trainkit.parallel.attention import apply_attention
from trainkit.parallel.activation_checkpoint import apply_ac
from trainkit.parallel.compile import apply_compile, apply_inductor_config
from trainkit.parallel.float8 import apply_float8
from trainkit.parallel.fsdp import all_gathers_per_step, apply_fsdp, apply_prefetch, fsdp_mode
from trainkit.parallel.frozen import frozen_lists, replicate_frozen
from trainkit.parallel.precision import mp_policy


@dataclass
class ParallelPlan:
    """What parallelize() did, in order (tests and metrics read it)."""

    applied: list[str] = field(default_factory=list)  # step names in the order applied
    recompute: dict[str, list[int]] = field(default_factory=dict)  # block list -> wrapped indices
    compiled_blocks: int = 0
    float8_linears: list[str] = field(default_factory=list)  # linears converted to FP8 GEMMs
    units: list[FSDPModule] = field(default_factory=list)  # FSDP block units in forward order
    all_gathers_per_step: int = 0  # per forward + backward (x micro-batches per optimiser step)
    frozen_lists: tuple[str, ...] = ()  # block lists with no trained parameter
    frozen_replicated: int = 0  # frozen parameters kept out of FSDP (elements)
    cuda_graphs: bool = False  # the micro-step is captured (cudagraphs.py)
    fsdp: str = "none"  # the FSDP mode applied ("none" on one rank with parallel.fsdp_one_rank false)


def check_parallel(model: nn.Module, cfg: ParallelConfig, world_size: int, *, cuda: bool | None = None) -> None:
    """ConfigError for switches this model cannot take (a block list it has not, recompute of a frozen
    list, CUDA graphs without CUDA). `model` may be on the meta device: the trainer checks before any
    GPU work, and the preset test (tests/trainkit/config/test_trainkit_shipped_presets.py) at full size; `cuda`:
    whether the run has a CUDA device (None: this machine's answer)."""
    lists = tuple(model.BLOCK_LISTS)
    for key in ("group", "ac_stride"):
        unknown = sorted(set(getattr(cfg, key)) - set(lists))
        if unknown:
            raise ConfigError(f"parallel.{key}.{unknown[0]}", f"not a block list of this model ({', '.join(lists)})")
    if cfg.fsdp != "none" and world_size < 1:
        raise ConfigError("parallel.fsdp", "needs torch.distributed initialised")
    fsdp = fsdp_mode(cfg, world_size)
    plan = ParallelPlan(frozen_lists=frozen_lists(model, lists), fsdp=fsdp)
    recomputed_frozen = sorted(k for k, v in cfg.ac_stride.items() if v and k in plan.frozen_lists)
    if recomputed_frozen:
        raise ConfigError(f"parallel.ac_stride.{recomputed_frozen[0]}", "a frozen block list runs under no_grad and "
                          "keeps no activation: there is nothing to recompute (set it to 0 or leave it out)")
    if cfg.cuda_graphs and not (torch.cuda.is_available() if cuda is None else cuda):
        raise ConfigError("parallel.cuda_graphs", "needs a CUDA device (this machine has none): "
                          "--set parallel.cuda_graphs=false, or a tiny preset for a CPU try (trainkit configs)")


def parallelize(model: nn.Module, cfg: ParallelConfig, world_size: int) -> ParallelPlan:
    """Apply attention/FP8 swaps, AC, compile, FSDP and prefetch to `model` in place, as configured."""
    check_parallel(model, cfg, world_size)
    lists = tuple(model.BLOCK_LISTS)
    fsdp = "none" if world_size == 1 and not cfg.fsdp_one_rank else cfg.fsdp
    plan = ParallelPlan(frozen_lists=frozen_lists(model, lists), fsdp=fsdp)
    # 0. frozen parameters out of FSDP, in the compute dtype (on meta: materialised so)
    ignored = set()
    if cfg.frozen == "replicate":
        ignored = replicate_frozen(model, compute_dtype(cfg))
        plan.frozen_replicated = sum(p.numel() for p in ignored)
        if ignored:
            plan.applied.append("frozen_replicated")
    # 0. then swap in the mask-free joint attention and the FP8 linears
    if cfg.attention != "masked":
        apply_attention(model, cfg.attention, cfg.param_dtype)
        plan.applied.append(f"attention_{cfg.attention}")
    if cfg.float8_modules:
        plan.float8_linears = apply_float8(model, cfg.float8_modules, cfg.float8_recipe)
        plan.applied.append("float8")
    # 1. recompute: innermost wrapper around a block
    if any(cfg.ac_stride.values()):
        plan.recompute = apply_ac(model, cfg.ac_stride)
        plan.applied.append("activation_checkpointing")
    # 2. compile each block (with its checkpoint wrapper inside the graph)
    if cfg.compile:
        if cfg.inductor:
            apply_inductor_config(cfg.inductor)
            plan.applied.append("inductor_config")
        plan.compiled_blocks = apply_compile(model, lists)
        plan.applied.append("compile")
    # 3. FSDP2 units per block group, then the root; bf16 params, fp32 reduce
    if fsdp != "none":
        plan.units = apply_fsdp(model, fsdp, lists, cfg.group, mp_policy(cfg.param_dtype, cfg.reduce_dtype),
                                cfg.reshard_after_forward, ignored)
        plan.applied.append(f"fsdp_{fsdp}")
        frozen_units = sum(not any(p.requires_grad for p in u.parameters()) for u in plan.units)
        plan.all_gathers_per_step = all_gathers_per_step(fsdp, len(plan.units), cfg.reshard_after_forward,
                                                         world_size=world_size, frozen_units=frozen_units)
    # 4. explicit prefetch between the units just made
    if cfg.prefetch and len(plan.units) > 1:
        apply_prefetch(plan.units)
        plan.applied.append("prefetch")
    # 5. CUDA graphs of the micro-step (the trainer builds it: cudagraphs.micro_step)
    if cfg.cuda_graphs:
        plan.cuda_graphs = True
        plan.applied.append("cuda_graphs")
    return plan


def compute_dtype(cfg: ParallelConfig) -> torch.dtype:
    """The dtype activations are computed in (images are normalised straight into it)."""
    return torch.bfloat16 if cfg.param_dtype == "bfloat16" else torch.float32

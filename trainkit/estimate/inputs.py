"""The memory estimate's inputs, built in one place: `trainkit inspect` (estimate/inspect.py),
`trainkit tune` (trials/tune.py, for every setting of its space) and the trainer's launch check
(check_memory at launch, in inspect.py) all estimate from `memory_inputs`.

    inputs = memory_inputs(cfg, world_size)            # the model built once, on the meta device
    parts = estimate_setting(inputs, micro=8, world=2, accum=1, group={}, stride={"lm_layers": 2},
                             compiled=True, graphs=False)   # memory.estimate's dict, GiB

What a config switches on is read here once, as parallelize() applies it: the FSDP mode
(`parallel/fsdp.py` `fsdp_mode`: none on one rank without `fsdp_one_rank`), frozen parameters held
whole out of FSDP (`parallel.frozen = "replicate"`, their block lists get no unit), the image slots
a batch carries, the family's activation terms (joint attention, FP8), param/reduce dtypes and the
EMA's fp32 average (`train.ema_decay`). Issue 37: these were assembled three times and had drifted
(tune left the EMA out, ranking `pi05_finetune`'s settings 4 bytes per trained parameter low);
tests/trainkit/estimate/test_memory_inputs.py holds tune's estimates to inspect's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn as nn

from trainkit.errors import ModelConfigError
from trainkit.estimate.memory import (block_params, estimate, fsdp_units, gathered_params, recompute_map, unit_sizes,
                                      with_terms)
from trainkit.models import Activations, Family, build_config, build_model, family
from trainkit.parallel.float8 import float8_targets
from trainkit.parallel.fsdp import fsdp_mode

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


@dataclass(frozen=True, kw_only=True)
class MemoryInputs:
    """What the estimate of one config at one world size reads, whatever the setting of the
    switches a search varies (micro-batch, recompute strides, FSDP groups, compile, CUDA graphs)."""

    family: Family
    model_cfg: Any  # the family's config: preset + model.* overrides
    model: nn.Module  # built on the meta device (or the trainer's own, still there)
    total: int  # parameters
    trainable: int  # parameters that train
    replicated: int  # frozen parameters held whole on every rank, out of FSDP (parallel.frozen = "replicate")
    mode: str  # the FSDP mode applied ("none", "root", "block")
    blocks: dict[str, list[int]]  # parameters per block, per block list (memory.block_params)
    trained_blocks: dict[str, list[int]]  # trained parameters per block
    skip: tuple[str, ...]  # the block lists FSDP holds none of (frozen and replicated)
    slots: int  # image slots a batch carries
    table: Activations  # the family's saved elements for `slots`, with the switches' terms
    act_bytes: int  # parallel.param_dtype's bytes
    reduce_bytes: int  # parallel.reduce_dtype's bytes
    reshard: bool  # parallel.reshard_after_forward
    ema: bool  # train.ema_decay > 0: an fp32 average of the trained parameters
    graph_grads: str = "zeroed"  # parallel.graph_grads

    def unit_sizes(self, group: Mapping[str, int]) -> tuple[list[int], int]:
        """Parameter counts of the FSDP block units (forward order) and of the root unit."""
        held = {n: sizes for n, sizes in self.blocks.items() if n not in self.skip}
        return unit_sizes(held, self.total - self.replicated, self.mode, dict(group))


def image_slots(cfg: Any, fam: Family, model_cfg: Any) -> int:
    """The image slots a batch of this config can carry (the estimate's slot count)."""
    slots, most = list(getattr(cfg.data, "slots", []) or []), fam.max_slots(model_cfg)
    if not slots:
        return most
    n = sum(1 for s in slots if s) if getattr(cfg.data, "prune_slots", False) else len(slots)
    if not 1 <= n <= most:
        raise ModelConfigError(f"data.slots: {n} image slots, the model takes 1..{most}")
    return n


def activation_table(cfg: Any, fam: Family, model_cfg: Any, model: torch.nn.Module, slots: int) -> Activations:
    """The family's saved elements for `slots` image slots, with the terms its config switches turn
    on (`Family.memory_terms`) as parallelize() applies them: the joint attention
    `parallel.attention`, FP8 on the nn.Linear modules `parallel.float8_modules` matches (on a GPU
    run; the estimate is of one, so a CPU process estimates them too)."""
    table = fam.activations(model_cfg, slots)
    if fam.memory_terms is None:
        return table
    par = cfg.parallel
    patterns = list(getattr(par, "float8_modules", []) or [])
    float8 = {n: model.get_submodule(n).in_features for n in float8_targets(model, patterns)} if patterns else {}
    terms = fam.memory_terms(model_cfg, slots, {"attention": getattr(par, "attention", "masked"), "float8": float8})
    return with_terms(table, terms, fam.memory.terms)


def memory_inputs(cfg: Any, world_size: int, model: nn.Module | None = None) -> MemoryInputs:
    """The inputs of a RunConfig-like `cfg` (model.family/preset/overrides, data.slots/prune_slots,
    train.ema_decay, parallel.*) at `world_size`; `model`: that config's model already built on the
    meta device (the trainer's), else one is built here."""
    par = cfg.parallel
    fam, overrides = family(cfg.model.family), getattr(cfg.model, "overrides", {})
    model_cfg = build_config(cfg.model.family, cfg.model.preset, overrides)
    if model is None:
        with torch.device("meta"):
            model = build_model(cfg.model.family, cfg.model.preset, overrides)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    replicated = total - trainable if getattr(par, "frozen", "shard") == "replicate" else 0
    skip = tuple(n for n in model.BLOCK_LISTS
                 if replicated and not any(p.requires_grad for p in getattr(model, n).parameters()))
    slots = image_slots(cfg, fam, model_cfg)
    return MemoryInputs(
        family=fam, model_cfg=model_cfg, model=model, total=total, trainable=trainable, replicated=replicated,
        mode=fsdp_mode(par, world_size),
        # with frozen parameters replicated (LoRA's frozen base among a block's adapters too) FSDP holds the trained ones
        blocks=block_params(model, trained=bool(replicated)), trained_blocks=block_params(model, trained=True),
        skip=skip, slots=slots, table=activation_table(cfg, fam, model_cfg, model, slots),
        act_bytes=DTYPE_BYTES[par.param_dtype], reduce_bytes=DTYPE_BYTES[getattr(par, "reduce_dtype", "float32")],
        reshard=bool(getattr(par, "reshard_after_forward", True)), ema=bool(getattr(cfg.train, "ema_decay", 0.0)),
        graph_grads=str(getattr(par, "graph_grads", "zeroed")))


def estimate_setting(inp: MemoryInputs, *, micro: int, world: int, accum: int, group: Mapping[str, int],
                     stride: Mapping[str, int], compiled: bool, graphs: bool) -> dict[str, Any]:
    """memory.estimate's parts (GiB) of one setting of the switches, at `world` ranks."""
    units, root = inp.unit_sizes(group)
    reduced, root_unit = fsdp_units(inp.table, inp.blocks, inp.trained_blocks, inp.total - inp.replicated,
                                    inp.trainable, inp.mode, dict(group), inp.skip)
    return estimate(total=inp.total, trainable=inp.trainable,
                    gathered=gathered_params(inp.total - inp.replicated, units, root, inp.mode, inp.reshard, inp.act_bytes,
                                             inp.family.memory.autocast_copy if compiled else 1.0),
                    table=inp.table, recompute=recompute_map(inp.blocks, dict(stride)), micro=micro, world=world,
                    sharded=inp.mode != "none", act_bytes=inp.act_bytes, compiled=compiled, accum=accum,
                    calib=inp.family.memory, replicated=inp.replicated, units=reduced, root=root_unit,
                    reshard=inp.reshard, graphs=graphs, reduce_bytes=inp.reduce_bytes, ema=inp.ema,
                    zeroed_graph_grads=graphs and inp.mode == "none" and accum == 1 and inp.graph_grads == "zeroed")

"""`trainkit inspect`: what a run config will cost, computed on the meta device (no memory, no GPU).

`inspect_model(cfg, world_size)` builds the model on the meta device and returns a JSON-able dict;
the family's record (trainkit/models/family.py) gives its FLOPs, tokens and saved activations:

- `params`: total, trainable (frozen block lists excluded), and per part (each block list of the
  model's BLOCK_LISTS, `root` = the rest).
- `slots_max`: image slots a batch can carry (data.slots minus never-filled "" slots when
  data.prune_slots, else all); `tokens_per_sample` and `flops_per_sample` (fwd+bwd, no recompute)
  keyed by the number of slots present, "1".."slots_max".
- `fsdp`: the FSDP2 units and collectives per micro-batch forward+backward, under this model:
  "block": each group of `parallel.group[name]` consecutive blocks is one unit (ceil(n / g) per
  block list) plus the root unit. Forward all-gathers every unit once. FSDP2 reshards every
  non-root unit after forward (reshard_after_forward=True) and keeps the root gathered, so backward
  re-gathers the non-root units once each: all-gathers = units + (units - 1); with
  `parallel.reshard_after_forward = false` units stay gathered until backward: units. Every unit
  reduce-scatters its gradients once. "root": one unit, 1 all-gather, 1 reduce-scatter. "none": 0.
  Activation recompute runs inside a unit's backward, after its re-gather: no extra all-gather.
  `per_step` multiplies by the gradient-accumulation micro-steps. The counts are those at the
  given world size, as the run counts them: at world size 1 FSDP2 issues no collective, so they
  are 0 there; `sharded_all_gathers_per_microbatch` is the count at any world size > 1.
  Keys: mode, units, reshard_after_forward, block_units, root_params, largest_unit_params,
  all_gathers_forward, all_gathers_backward, all_gathers_per_microbatch,
  reduce_scatters_per_microbatch, grad_accum_steps, all_gathers_per_step,
  sharded_all_gathers_per_microbatch.
- `auto_micro_batch`: with train.micro_batch = "auto", the choice for the GPU compared with
  (trainkit/estimate/auto_batch.py: micro_batch, accum, global_batch, peak_gib, budget_gib, ...;
  the rest of the report is of that micro-batch), else None.
- `recompute`: the recomputed block indices per block list (`i % stride == 0`, as parallel/checkpointing).
- `memory` (GiB per GPU, an ESTIMATE of the allocated peak; trainkit/estimate/memory.py has the model):
  fp32 parameters and AdamW states, with train.ema_decay the weight EMA in optimizer_gib too
  (sharded over the world size; frozen parameters replicated by
  `parallel.frozen = "replicate"` cost param_dtype bytes each, whole, and are never gathered),
  fp32 gradients only under
  gradient accumulation, gathered parameters in param_dtype, saved activations of one micro-batch
  (the family's eager count with the terms its switches turn on, `inputs.activation_table`, x its measured
  ratio, compiled or eager; a recomputed block keeps only its input) and the block in backward (its recomputed forward, its gradient temporaries). The
  ratios are the family record's (`Family.memory`), fitted to the GPU runs listed there; against
  those runs the estimate is within 4.4% (bench/results/memory.md; pi05's 26 runs within 3.6%). That is the peak at the turn
  from forward to backward; where a later moment holds more (a unit's reduce-scatter buffers
  beside the gradients already reduced, or every gradient at the optimiser step: GR00T, any run
  recomputing everything or at a small micro-batch), the peak is that moment's (`moment`).
  Keys: params_gib, optimizer_gib, grads_gib, gathered_params_gib, activations_gib,
  backward_transient_gib (the turn's parts; their sum turn_gib), later (the reduce-scatter's and
  the optimiser step's parts, each with its peak_gib), peak_gib (the largest), moment ("turn",
  "reduce", "optimizer_step"), dynamic_gib (its part that scales with the micro-batch),
  activations_no_recompute_gib and
  activations_full_recompute_gib (the same micro-batch under no / every-block recompute), slots
  (the slot count estimated: slots_max), calibrated (the family's constants come from measured
  runs), estimate (always true); and the GPU it is compared with:
  gpu (this machine's first CUDA device, else the H200 the presets are tuned on), gpu_memory_gib,
  fits (peak <= gpu_memory_gib), fits_from_world_size (the least power-of-two world size whose
  estimate fits, None if none up to 1024: activations do not shrink with more GPUs) and
  peak_gib_at_fits_from.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from trainkit.estimate.auto_batch import AUTO, Choice, candidates, resolve_micro_batch, with_micro_batch
from trainkit.models import build_model
from trainkit.errors import LaunchError, ModelConfigError
from trainkit.estimate.inputs import MemoryInputs, estimate_setting, memory_inputs
from trainkit.estimate.memory import block_params, recompute_map
from trainkit.parallel.fsdp import all_gathers_per_step

GIB = 2 ** 30
# The GPU an estimate is compared with when this machine has none: the presets' (bench/results/
# pi05_h200.md), as torch.cuda.get_device_properties reported it on the H200 device, 2026-12-01
# (nvidia-smi: 143771 MiB).
H200 = ("NVIDIA H200", 150_109_880_320 / GIB)


def gpu_memory() -> tuple[str, float]:
    """(name, GiB) of this machine's first CUDA device, else of an H200."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.name, props.total_memory / GIB
    return H200


def device_memory(device: torch.device) -> tuple[str, float]:
    """(what, GiB) one process of a run on `device` has: the GPU's memory; on a CPU the host's
    (its cgroup's limit where lower) over the ranks torchrun starts on this node."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"one {props.name} ({device})", props.total_memory / GIB
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:  # cgroup v2: "max" or a byte count
        host = min(host, int(Path("/sys/fs/cgroup/memory.max").read_text().strip()))
    except (OSError, ValueError):
        pass
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    what = "host memory" + (f" shared by {ranks} ranks" if ranks > 1 else "")
    return what, host / ranks / GIB


def _units(inp: MemoryInputs, group: dict[str, int]) -> tuple[list[int], int, int]:
    """Parameter counts of the block units (forward order) and of the root unit, and how many of
    the block units are frozen (gathered in forward only); replicated frozen parameters are out
    of FSDP (parallel/frozen.py): their block lists get no unit."""
    lists = inp.model.BLOCK_LISTS
    unknown = sorted(set(group) - set(lists)) if inp.mode == "block" else []
    if unknown:
        raise ModelConfigError(f"parallel.group: unknown block list(s) {unknown}; known: {list(lists)}")
    units, root = inp.unit_sizes(group)
    frozen = [n for n in inp.blocks if n not in inp.skip
              and not any(p.requires_grad for p in getattr(inp.model, n).parameters())]
    frozen_units = sum(math.ceil(len(inp.blocks[n]) / group.get(n, 1)) for n in frozen) if units else 0
    return units, root, frozen_units


def inspect_model(cfg: Any, world_size: int = 1, gpu: tuple[str, float] | None = None,
                  model: Any = None) -> dict[str, Any]:
    """Report params, tokens, FLOPs, FSDP units/collectives and a per-GPU memory estimate for a
    RunConfig-like `cfg` (attributes model.family/preset, data.slots/prune_slots,
    train.micro_batch/global_batch, parallel.fsdp/group/ac_stride/param_dtype/compile), the
    estimate compared with `gpu` = (name, GiB) (default: `gpu_memory()`); `model`: that config's
    model already built on the meta device (the trainer's), else one is built here."""
    if world_size < 1:
        raise ModelConfigError(f"world_size must be >= 1, got {world_size}")
    par, train = cfg.parallel, cfg.train
    choice = None
    if train.micro_batch == AUTO:  # the card's micro-batch first (auto_batch.py): the rest is of that run
        if model is None:
            with torch.device("meta"):
                model = build_model(cfg.model.family, cfg.model.preset, getattr(cfg.model, "overrides", {}))
        try:
            cfg, choice = resolve_micro_batch(cfg, world_size, gpu or gpu_memory(), model)
        except LaunchError as e:  # nothing fits this world size: report the smallest, where it fits from
            smallest = candidates(train.global_batch, world_size)[-1]
            cfg = with_micro_batch(cfg, smallest, train.global_batch or smallest * world_size)
            choice = e
        par, train = cfg.parallel, cfg.train
    inp = memory_inputs(cfg, world_size, model)  # the estimate's inputs, as tune and the trainer's check read them
    fam, model_cfg, model = inp.family, inp.model_cfg, inp.model
    total, trainable, mode = inp.total, inp.trainable, inp.mode
    parts = {name: sum(p.numel() for p in getattr(model, name).parameters()) for name in model.BLOCK_LISTS}
    parts["root"] = total - sum(parts.values())
    slots_max = inp.slots

    units, root, frozen_units = _units(inp, dict(par.group))
    n_units = len(units) + 1 if mode != "none" else 0
    reshard = inp.reshard
    sharded = all_gathers_per_step(mode, len(units), reshard, world_size=2,  # parallel/fsdp.py: the one rule
                                   frozen_units=frozen_units)
    per_micro = all_gathers_per_step(mode, len(units), reshard, world_size=world_size, frozen_units=frozen_units)
    ag_fwd = n_units if per_micro else 0  # forward gathers every unit; backward re-gathers the rest
    micro = train.micro_batch
    accum = max(1, (getattr(train, "global_batch", 0) or micro * world_size) // (micro * world_size))
    fsdp = {"mode": mode, "units": n_units, "reshard_after_forward": reshard, "block_units": len(units), "root_params": root if mode != "none" else 0,
            "largest_unit_params": max(units, default=root if mode != "none" else 0),
            "all_gathers_forward": ag_fwd, "all_gathers_backward": per_micro - ag_fwd,
            "all_gathers_per_microbatch": per_micro, "reduce_scatters_per_microbatch": n_units if per_micro else 0,
            "grad_accum_steps": accum, "all_gathers_per_step": per_micro * accum,
            "sharded_all_gathers_per_microbatch": sharded}

    stride = dict(par.ac_stride)
    unknown = sorted(set(stride) - set(model.BLOCK_LISTS))
    if unknown:
        raise ModelConfigError(f"parallel.ac_stride: unknown block list(s) {unknown}; known: {list(model.BLOCK_LISTS)}")
    recompute = recompute_map(block_params(model), stride)

    def memory_at(world: int) -> dict[str, Any]:
        return estimate_setting(inp, micro=micro, world=world, accum=accum, group=dict(par.group), stride=stride,
                                compiled=bool(getattr(par, "compile", False)),
                                graphs=bool(getattr(par, "cuda_graphs", False)))

    memory = memory_at(world_size)
    memory.update(slots=slots_max, calibrated=bool(fam.memory.measured), estimate=True)
    name, gib = gpu or gpu_memory()
    fits_from = next((w for w in (2 ** i for i in range(11)) if memory_at(w)["peak_gib"] <= gib), None)
    memory.update(gpu=name, gpu_memory_gib=round(gib, 2), fits=memory["peak_gib"] <= gib,
                  fits_from_world_size=fits_from,
                  peak_gib_at_fits_from=None if fits_from is None else memory_at(fits_from)["peak_gib"])
    return {
        "family": cfg.model.family, "preset": cfg.model.preset, "world_size": world_size, "micro_batch": micro,
        # the card's choice; {"refused": its one line} when no micro-batch fits this world size (the
        # report is then of the smallest, with fits_from_world_size), None for a micro-batch set by number
        "auto_micro_batch": None if choice is None else {"refused": str(choice)} if isinstance(choice, LaunchError)
        else choice.as_dict(),
        "config": dataclasses.asdict(model_cfg),  # every shape the estimate is of (preset + model.* overrides)
        "params": {"total": total, "trainable": trainable, "by_part": parts},
        "slots_max": slots_max,
        "tokens_per_sample": {str(n): fam.tokens_per_sample(model_cfg, n) for n in range(1, slots_max + 1)},
        "flops_per_sample": {str(n): fam.flops_per_sample(model_cfg, n) for n in range(1, slots_max + 1)},
        "fsdp": fsdp, "recompute": recompute, "memory": memory,
    }


def _si(x: float, unit: str) -> str:
    """1234567 -> '1.23M' + unit: readable at tiny and full sizes alike."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{prefix}{unit}"
    return f"{x:.0f}{unit}"


def _mem(gib: float) -> str:
    """GiB to one decimal, or MiB (KiB) where that rounds to zero: tiny presets read as numbers."""
    for scale, unit in ((1, "GiB"), (1024, "MiB"), (1024 ** 2, "KiB")):
        if abs(gib * scale) >= 0.05:
            return f"{gib * scale:.1f} {unit}"
    return f"{gib * 1024 ** 2:.1f} KiB" if gib else "0 GiB"


def _grads_why(m: dict[str, Any]) -> str:
    """Why the turn holds no gradient while the model trains billions of parameters (memory.py), and
    what they take where they are all alive; "" when the turn has gradients (accumulation) or none train."""
    at = m["later"].get("optimizer_step", {})
    if m["grads_gib"] or not at.get("grads_gib"):
        return ""
    return (f"  grads 0 GiB at the forward/backward turn: none exists yet (freed every step, backward makes them "
            f"as it frees activations); all {_mem(at['grads_gib'])} are alive at the optimiser step, whose peak is "
            f"{_mem(at['peak_gib'])}")


MOMENTS = {"reduce": "a reduce-scatter (its buffers beside the gradients reduced so far)",
           "optimizer_step": "the optimiser step (every gradient alive)"}


def format_report(report: dict[str, Any]) -> str:
    """Human-readable lines of an `inspect_model` report (with `trainkit inspect`'s "loader" section,
    trainkit/estimate/loader.py, when the report has one)."""
    p, f, m = report["params"], report["fsdp"], report["memory"]
    world = report["world_size"]
    lines = [f"model {report['family']}/{report['preset']}: {_si(p['total'], '')} params "
             f"({_si(p['trainable'], '')} trainable; " + ", ".join(f"{k} {_si(v, '')}" for k, v in p["by_part"].items()) + ")"]
    if "init_from" in report:  # trainkit inspect: the shape model.init_from's checkpoint fixes
        fields = report["init_from"]["fields"]
        lines.append(f"  shape from model.init_from {report['init_from']['folder']}: "
                     + ", ".join(f"{k} {f['value']}" for k, f in fields.items()))
    for n, tok in report["tokens_per_sample"].items():
        lines.append(f"  {n} slot(s): " + ", ".join(f"{v} {k}" for k, v in tok.items()) + " tokens, "
                     f"{_si(report['flops_per_sample'][n], 'FLOP')}/sample fwd+bwd")
    if f["mode"] != "none" and world == 1:
        lines.append(f"FSDP {f['mode']}: {f['units']} units, no all-gather or reduce-scatter at world size 1 (FSDP2 "
                     f"issues no collective on one rank); {f['sharded_all_gathers_per_microbatch']} all-gathers per "
                     "micro-batch at world size > 1")
    else:
        lines.append(f"FSDP {f['mode']}: {f['units']} units, all-gathers {f['all_gathers_forward']} fwd + "
                     f"{f['all_gathers_backward']} bwd = {f['all_gathers_per_microbatch']} per micro-batch, "
                     f"{f['all_gathers_per_step']} per step ({f['grad_accum_steps']} micro-batches)")
    if report.get("auto_micro_batch") and "refused" in report["auto_micro_batch"]:
        lines.append(report["auto_micro_batch"]["refused"])
    elif report.get("auto_micro_batch"):
        lines.append(Choice(**{**report["auto_micro_batch"], "larger": tuple(map(tuple, report["auto_micro_batch"]["larger"]))}).line())
    lines.append("recompute: " + ", ".join(f"{k} {len(v)} blocks" for k, v in report["recompute"].items()))
    summed = ("params", "optimizer", "grads", "gathered_params", "activations", "backward_transient")
    turn = " + ".join(f"{k} {_mem(m[k + '_gib'])}" for k in summed)
    head = f"memory estimate per GPU (world {world}, micro-batch {report['micro_batch']}, {m['slots']} slots): peak "
    if m["moment"] == "turn":
        lines.append(f"{head}{_mem(m['peak_gib'])} = {turn}")
    else:  # a later moment holds more than the forward/backward turn (trainkit/estimate/memory.py)
        at = m["later"][m["moment"]]
        lines.append(f"{head}{_mem(m['peak_gib'])} at {MOMENTS[m['moment']]} = params {_mem(m['params_gib'])} + optimizer "
                     f"{_mem(m['optimizer_gib'])} + " + " + ".join(f"{k[:-4]} {_mem(v)}" for k, v in at.items()
                                                                    if k != "peak_gib"))
        lines.append(f"  at the forward/backward turn {_mem(m['turn_gib'])} = {turn}")
    if why := _grads_why(m):
        lines.append(why)
    lines.append(f"  activations without recompute {_mem(m['activations_no_recompute_gib'])}, "
                 f"with recompute of every block {_mem(m['activations_full_recompute_gib'])}")
    lines.append("  the allocated peak, calibrated on this family's measured GPU runs (bench/results/memory.md)"
                 if m["calibrated"] else "  not calibrated: this family lists no measured GPU run (Family.memory)")
    if not m["fits"]:
        w = m["fits_from_world_size"]
        more = (f"at --world-size {w} it is {_mem(m['peak_gib_at_fits_from'])}" if w is not None else
                f"more GPUs do not fix it (activations {_mem(m['activations_gib'])} per GPU do not shrink with the "
                "world size)")
        lines.append(f"WARNING: the estimated peak {_mem(m['peak_gib'])} exceeds the {m['gpu_memory_gib']:.1f} GiB of "
                     f"one {m['gpu']} at world size {world}: {more}. Lower train.micro_batch or recompute blocks "
                     f"(parallel.ac_stride; every block recomputed: activations "
                     f"{_mem(m['activations_full_recompute_gib'])}).")
    if "loader" in report:
        from trainkit.estimate.loader import format_loader
        lines += format_loader(report["loader"])
    return "\n".join(lines)


def check_memory(cfg: Any, world_size: int, device: torch.device, model: nn.Module) -> None:
    """Refuse a launch whose estimated peak memory per GPU (`trainkit inspect`'s, from a meta-device
    build: ~0.1 s for a tiny preset) exceeds train.memory_cap_gib or the memory of `device` (on a
    CPU the host's): an absurd model size fails here in one line, not in the allocator or by the
    kernel's OOM killer. `model`: the run's model, still on the meta device."""
    what, limit = device_memory(device)
    memory = inspect_model(cfg, world_size=world_size, gpu=(what, limit), model=model)["memory"]
    est = memory["peak_gib"]
    if cfg.train.memory_cap_gib and est > cfg.train.memory_cap_gib:
        raise LaunchError(f"model.preset={cfg.model.preset!r}: estimated peak memory {est:.1f} GiB per GPU exceeds "
                          f"train.memory_cap_gib={cfg.train.memory_cap_gib:g} (see `trainkit inspect`)")
    if est > limit:
        model = f"{cfg.model.family}/{cfg.model.preset}" + "".join(f" model.{k}={v}" for k, v in cfg.model.overrides.items())
        more = memory["fits_from_world_size"]
        hint = f"it fits from world size {more}" if more and more > world_size else \
            "lower train.micro_batch, recompute blocks (parallel.ac_stride) or shrink the model"
        raise LaunchError(f"model {model}: estimated peak memory {est:.1f} GiB per rank exceeds the "
                          f"{limit:.1f} GiB of {what} at world size {world_size}; {hint} (see `trainkit inspect`)")

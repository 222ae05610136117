"""`train.micro_batch = "auto"`: the largest micro-batch whose calibrated memory estimate fits the card.

    cfg, choice = resolve_micro_batch(cfg, world_size=1, gpu=("NVIDIA H100 80GB HBM3", 79.19))
    print(choice.line())   # micro-batch 24 (x 2 accumulation = global batch 48): estimated peak 75.96 GiB ...

The optimised presets are tuned on one card (pi05_optimised at micro-batch 48 on a 141 GB H200)
and used on others (most users have 80 GB). So they name the optimiser's batch
(`train.global_batch`) and leave the micro-batch to the card: the candidates are the micro-batches
that split the global batch evenly over the ranks (the rest is gradient accumulation, so the
optimiser sees the same batch on every card), largest first; the first whose peak estimate
(`trainkit inspect`'s: trainkit/estimate/memory.py with the family's MemoryCalibration, fitted to
measured GPU runs; the accumulation's fp32 gradients counted) is at most the card's memory less
`train.memory_headroom` of it is the choice. Without a global batch (0) the candidates are
the powers of two up to `MOST` and the global batch is the choice x world size (no accumulation).

The headroom is what the estimate does not count: its error (within 4.4% over the calibrated runs,
bench/results/memory.md), the CUDA context and the caching allocator's reserve beyond the
allocated peak, which grows where a run frees and reallocates much (gradient accumulation). Its
default, 10%, is from one H100 80GB (79.19 GiB; bench/results/pi05_h100.md): pi05_optimised at
micro-batch 16 x 3 accumulation, estimated 75.30 GiB (4.9% free), thrashed the allocator: 12.3 s
steps, 3.9 samples/s; at 12 x 4 (68.9 GiB allocated, 13% free) 32.9 samples/s, as fast as
micro-batch 24 without accumulation (32.7, 76.0 GiB: that one ran with 4% free). An H200 run
at micro-batch 56 (132.7 of 139.8 GiB, 5% free) thrashed likewise (pi05/memory.py). More headroom
trades speed for safety; less is for runs measured to fit.

When no candidate fits, the launch is refused in one line naming the smallest candidate's estimate
and the world size from which it would fit, before any GPU work. The trainer logs the choice, and
`trainkit inspect CONFIG --gpu-memory-gib 80` prints it without a GPU.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainkit.errors import LaunchError

AUTO = "auto"
MOST = 1024  # the largest micro-batch tried without a global batch


@dataclass(frozen=True)
class Choice:
    """The micro-batch chosen for a card, and why."""

    micro_batch: int
    accum: int  # gradient-accumulation micro-batches per optimiser step
    global_batch: int  # micro_batch x world size x accum
    world_size: int
    peak_gib: float  # its estimated peak per GPU
    budget_gib: float  # the card's memory less the headroom
    gpu: str
    gpu_memory_gib: float
    headroom: float
    larger: tuple[tuple[int, float], ...]  # (micro-batch, estimated peak) of the larger candidates refused

    def line(self) -> str:
        """The one line the trainer logs and `trainkit inspect` prints."""
        over = (f"; {self.larger[-1][0]} would need {self.larger[-1][1]:.2f} GiB" if self.larger else "")
        return (f"train.micro_batch auto: {self.micro_batch} (x {self.accum} accumulation x {self.world_size} "
                f"rank{'s' if self.world_size > 1 else ''} = global batch {self.global_batch}): estimated peak "
                f"{self.peak_gib:.2f} GiB <= {self.budget_gib:.2f} GiB ({self.gpu}, {self.gpu_memory_gib:.2f} GiB "
                f"less {self.headroom:.0%} headroom){over}")

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "larger": [list(x) for x in self.larger]}


def candidates(global_batch: int, world_size: int) -> list[int]:
    """Micro-batches to try, largest first: the divisors of the per-rank global batch, or without one
    (0) the powers of two up to MOST."""
    if not global_batch:
        return [2 ** i for i in range(MOST.bit_length() - 1, -1, -1)]
    if global_batch % world_size:
        raise LaunchError(f"train.global_batch={global_batch} is not divisible by the world size {world_size}")
    per_rank = global_batch // world_size
    return [m for m in range(per_rank, 0, -1) if per_rank % m == 0]


def with_micro_batch(cfg: Any, micro: int, global_batch: int) -> Any:
    """`cfg` with train.micro_batch = micro and train.global_batch = global_batch."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch=micro, global_batch=global_batch))


def choose_micro_batch(cfg: Any, world_size: int, gpu: tuple[str, float], model: Any = None) -> Choice:
    """The largest candidate whose estimate fits `gpu` = (name, GiB) less train.memory_headroom;
    LaunchError (one line) when none does. `model`: the config's model on the meta device, if built.
    The estimate is inspect's (estimate/inputs.py: one home for its inputs), built once for all candidates."""
    from trainkit.estimate.inputs import estimate_setting, memory_inputs
    name, gib = gpu
    headroom = cfg.train.memory_headroom
    budget = gib * (1.0 - headroom)
    par = cfg.parallel
    inp = memory_inputs(cfg, world_size, model)

    def peak(micro: int, global_batch: int, world: int) -> float:
        accum = max(1, global_batch // (micro * world))
        return estimate_setting(inp, micro=micro, world=world, accum=accum, group=dict(par.group),
                                stride=dict(par.ac_stride), compiled=bool(getattr(par, "compile", False)),
                                graphs=bool(getattr(par, "cuda_graphs", False)))["peak_gib"]

    refused: list[tuple[int, float]] = []
    for micro in candidates(cfg.train.global_batch, world_size):
        global_batch = cfg.train.global_batch or micro * world_size
        est = peak(micro, global_batch, world_size)
        if est <= budget:
            return Choice(micro_batch=micro, accum=global_batch // (micro * world_size), global_batch=global_batch,
                          world_size=world_size, peak_gib=est, budget_gib=round(budget, 2), gpu=name,
                          gpu_memory_gib=round(gib, 2), headroom=headroom, larger=tuple(refused))
        refused.append((micro, est))
    smallest, est = refused[-1]
    global_batch = cfg.train.global_batch or smallest * world_size
    more = next((w for w in (2 ** i for i in range(11)) if peak(smallest, global_batch, w) <= gib), None)
    hint = (f"it fits from world size {more} (at the card's full memory)" if more and more > world_size else
            "recompute blocks (parallel.ac_stride), shrink the model or use a larger card")
    raise LaunchError(f"train.micro_batch auto: nothing fits {name} ({gib:.2f} GiB less {headroom:.0%} headroom = "
                      f"{budget:.2f} GiB) at world size {world_size}: micro-batch {smallest} is estimated at "
                      f"{est:.2f} GiB; {hint} (see `trainkit inspect`)")


def resolve_micro_batch(cfg: Any, world_size: int, gpu: tuple[str, float],
                        model: Any = None) -> tuple[Any, Choice | None]:
    """(`cfg` with its micro-batch and global batch decided, the Choice); a config whose micro-batch
    is a number comes back as it is, with None."""
    if cfg.train.micro_batch != AUTO:
        return cfg, None
    choice = choose_micro_batch(cfg, world_size, gpu, model)
    return with_micro_batch(cfg, choice.micro_batch, choice.global_batch), choice

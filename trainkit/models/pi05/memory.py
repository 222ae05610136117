"""The `pi05` family's memory constants and the GPU runs they were fitted to.

Every measured peak below is torch.cuda.max_memory_allocated per GPU over a `trainkit run` of the
`full` preset on H200s (the trainer's "peak memory (allocated)"), the steady-state figure of
bench/results/trainkit_gpu_call*.json (2 GPUs, 2026-11-30; commands in bench/results/trainkit.md)
and the one-GPU run quoted in issue 19. `python bench/memory_table.py --fit pi05` refits the
constants from this list; bench/results/memory.md shows each run's estimate beside its peak
(largest error 3.8%). What they say: torch.compile saves 17% fewer bytes than the eager count
(Inductor recomputes pointwise ops in backward instead of saving them); eager saves what the count
says (-0.1%); the block in backward holds 1.30x its own eager set in gradient temporaries.
Calls 2-7 ran the model of commit 8ab8de9, call 1 that of 528edde (same shapes; its attention
kept 1.6 GiB more at micro-batch 32).
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration, MemoryMeasurement

_CALLS = "bench/results/trainkit_gpu_call"
OPT, BASE = "pi05_optimised.toml", "pi05_baseline.toml"


# pi05_optimised as it was when these ran (issue 28 since turned on varlen and FP8 at micro-batch 48)
THEN = ("parallel.attention=masked", "parallel.float8_modules=[]")


def _m(config: str, sets: tuple[str, ...], world: int, peak: float, source: str) -> MemoryMeasurement:
    if config == OPT:
        sets = (*THEN, *(() if any(s.startswith("train.micro_batch=") for s in sets) else ("train.micro_batch=40",)),
                *sets)
    return MemoryMeasurement(config=config, sets=sets, world_size=world, peak_gib=peak, source=source)


MEASURED = (
    _m(BASE, (), 2, 38.73, f"{_CALLS}{{1,2,4,7}}: baseline"),
    _m(OPT, ("train.micro_batch=32",), 2, 85.94, f"{_CALLS}1_main.json: optimised (micro-batch 32 then; model 528edde)"),
    _m(OPT, ("train.micro_batch=32",), 2, 84.36, f"{_CALLS}{{6,7}}: mbs32"),
    _m(OPT, ("train.micro_batch=32", "parallel.reshard_after_forward=false"), 2, 88.86, f"{_CALLS}2_tune.json: keep_params"),
    _m(OPT, (), 2, 100.47, f"{_CALLS}{{3,4,5,6,7}}: optimised, {_CALLS}2: mbs40, {_CALLS}5: nccl_ctas8"),
    _m(OPT, ("parallel.reshard_after_forward=false",), 2, 104.97, f"{_CALLS}2_tune.json: mbs40_keep"),
    _m(OPT, ("parallel.compile=false",), 2, 115.63, f"{_CALLS}2_tune.json: no_compile"),
    _m(OPT, ("parallel.prefetch=false",), 2, 100.47, f"{_CALLS}2_tune.json: no_prefetch"),
    _m(OPT, ("parallel.fsdp=root",), 2, 109.27, f"{_CALLS}2_tune.json: no_per_block_fsdp"),
    _m(OPT, ("parallel.group={vision_blocks = 1, lm_layers = 1}",), 2, 100.47, f"{_CALLS}3_ablation.json: no_grouping"),
    _m(OPT, ("optim.fused=false",), 2, 100.47, f"{_CALLS}3_ablation.json: no_fused_adamw"),
    _m(OPT, ("data.prune_slots=false",), 2, 131.57, f"{_CALLS}3_ablation.json: no_slot_pruning"),
    _m(OPT, ("data.h2d_dtype=float32",), 2, 100.43, f"{_CALLS}3_ablation.json: float32_h2d"),
    _m(OPT, ("parallel.expandable_segments=false",), 2, 100.69, f"{_CALLS}3_ablation.json: no_expandable_segments"),
    _m(OPT, ("parallel.ac_stride={vision_blocks = 1, lm_layers = 1}",), 2, 30.81, f"{_CALLS}3_ablation.json: recompute_all"),
    _m(OPT, ("train.micro_batch=48",), 2, 116.58, f"{_CALLS}5_candidates.json: mbs48"),
    _m(OPT, ("train.micro_batch=56",), 2, 132.69, f"{_CALLS}5_candidates.json: mbs56 (allocator thrashing: 2.2 s steps)"),
    _m(OPT, ("train.micro_batch=32",), 1, 102.3, "issue 19: one H200, 2026-12-01"),
)

# fitted by `python bench/memory_table.py --fit pi05` to MEASURED, 2026-12-01
MEMORY = MemoryCalibration(saved_compiled=0.8323, saved_eager=0.9991, backward_block=1.302, measured=MEASURED)

"""The `pi05` family's memory constants and the GPU runs they were fitted to.

Every measured peak below is torch.cuda.max_memory_allocated per GPU over a `trainkit run` of the
`full` preset on H200s (the trainer's "peak memory (allocated)"): the steady-state figure of
bench/results/trainkit_gpu_call*.json (2 GPUs, 2026-11-30; commands in bench/results/pi05_h200.md),
the one-GPU run quoted in issue 19, and the one-GPU runs of bench/results/gpu_pi05_main_2026-12-02.json
and gpu_pi05_perf_call1_2026-12-02.json (the variants named; each JSON has its command).
`python bench/gpu/memory_table.py --fit pi05` refits the constants from this list;
bench/results/memory.md shows each run's estimate beside its peak (largest pi05 error 3.6%: one
root FSDP unit). What they say: torch.compile saves 18% fewer bytes than the eager count (Inductor
recomputes pointwise ops in backward instead of saving them); eager saves 0.98x the count; the
block in backward holds 1.19x its own eager set in gradient temporaries. The two switchable terms
(pi05/flops.py `memory_terms`, x the compiled ratio like the rest of a block): the
key-padding-masked attention keeps 1.18x a query-sized tensor per call beyond varlen (1.65 GiB at
micro-batch 32, measured and estimated), FP8 GeGLU frees 1.05x its linears' bf16 inputs (11.89 GiB
measured at micro-batch 32, 12.33 estimated).
Calls 2-7 ran the model of commit 8ab8de9, call 1 that of 528edde (same shapes; its attention
kept 1.6 GiB more at micro-batch 32).
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration, MemoryMeasurement

_CALLS = "bench/results/trainkit_gpu_call"
OPT, BASE = "pi05_optimised.toml", "pi05_baseline.toml"


# pi05_optimised as it was when these ran (issue 28 since turned on varlen and FP8 at micro-batch 48)
THEN = ("parallel.attention=masked", "parallel.float8_modules=[]")


_H100 = "bench/results/h100_2026-12-07b"
# pi05_optimised before 2026-12-07b: FSDP2 per block on one rank, rowwise FP8, no graphs
FSDP_ROW = ("parallel.fsdp_one_rank=true", "parallel.float8_recipe=rowwise", "parallel.cuda_graphs=false")
_MAIN, _PERF = "bench/results/gpu_pi05_main_2026-12-02.json", "bench/results/gpu_pi05_perf_call1_2026-12-02.json"
GEGLU = '["lm_layers.*.lm.mlp.*"]'
# pi05_optimised when gpu_pi05_perf_call1 ran: varlen + FP8 GeGLU (as now) at micro-batch 40, deferred check
NOW40 = ("train.micro_batch=40", "train.nonfinite_check=deferred")


def _merge(base: tuple[str, ...], sets: tuple[str, ...]) -> tuple[str, ...]:
    """`base`'s settings whose key `sets` does not set, then `sets`."""
    keys = {x.split("=", 1)[0] for x in sets}
    return (*(x for x in base if x.split("=", 1)[0] not in keys), *sets)


def _m(config: str, sets: tuple[str, ...], world: int, peak: float, source: str, now: bool = False) -> MemoryMeasurement:
    """One run; a run of pi05_optimised before issue 28 (`now` False) starts from THEN's settings at
    micro-batch 40, a run after it (`now`) from the config as it is; its own `sets` win."""
    if config == OPT and not now:
        sets = _merge((*THEN, "train.micro_batch=40"), sets)
    if config == OPT:
        sets = _merge(FSDP_ROW, sets)
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
    # one H200, 2026-12-02: pi05_optimised then was masked, bf16, micro-batch 40 (THEN)
    _m(BASE, (), 1, 60.59, f"{_MAIN}: baseline"),
    _m(OPT, ("train.micro_batch=32",), 1, 102.27, f"{_MAIN}: optimised_mbs32"),
    _m(OPT, ("train.micro_batch=32", "parallel.attention=varlen"), 1, 100.62, f"{_MAIN}: varlen_mbs32"),
    _m(OPT, ("train.micro_batch=32", "parallel.attention=varlen", f"parallel.float8_modules={GEGLU}"), 1, 88.73,
       f"{_MAIN}: varlen_fp8_mbs32"),
    # one H200, 2026-12-02: pi05_optimised with varlen + FP8 GeGLU at micro-batch 40, deferred check (NOW40)
    _m(OPT, NOW40, 1, 101.46, f"{_PERF}: optimised", now=True),
    _m(OPT, _merge(NOW40, ("train.nonfinite_check=sync",)), 1, 101.46, f"{_PERF}: sync_check", now=True),
    _m(OPT, (*NOW40, "parallel.cuda_graphs=true"), 1, 101.39, f"{_PERF}: cuda_graphs", now=True),
    _m(OPT, ("train.micro_batch=48",), 1, 114.19, f"{_PERF}: optimised_mbs48 (the config as shipped)", now=True),
    # one H100 80GB, 2026-12-07 (bench/results/pi05_h100.md, call 2-4): FSDP per block then, global batch 48
    _m(OPT, ("train.micro_batch=12",), 1, 68.89, f"{_H100}/call2_pi05.json: optimised (auto: 12 x 4)", now=True),
    _m(OPT, ("train.micro_batch=12", "parallel.float8_recipe=tensorwise"), 1, 68.63,
       f"{_H100}/call2_pi05.json: fp8_tensorwise", now=True),
    # one rank without FSDP (autocast): what autocast_copy is fitted to
    _m(OPT, ("parallel.fsdp_one_rank=false", "train.micro_batch=8"), 1, 63.80,
       f"{_H100}/call2_pi05.json: one_rank_plain (auto: 8 x 6)", now=True),
    _m(OPT, ("parallel.fsdp_one_rank=false", "parallel.float8_recipe=tensorwise", "train.micro_batch=8"), 1, 63.10,
       f"{_H100}/call3_pi05_plain_tensorwise.json", now=True),
    _m(OPT, ("parallel.fsdp_one_rank=false", "parallel.float8_recipe=tensorwise", "train.micro_batch=12"), 1, 69.48,
       f"{_H100}/call4_pi05_plain_tensorwise_headroom5.json (12 x 4)", now=True),
)

# fitted by `python bench/gpu/memory_table.py --fit pi05 --fix terms.masked_attention` to MEASURED, 2026-12-02;
# masked_attention fixed where the one pair that measures it alone (masked vs varlen, one H200, micro-batch
# 32: 1.65 GiB) puts it: fitted free it takes 1.50 (2.09 GiB) to pull the 2-GPU masked rows down 0.1%
MEMORY = MemoryCalibration(saved_compiled=0.8174, saved_eager=0.9813, backward_block=1.1878,
                           terms={"masked_attention": 1.18, "float8": 1.0451},
                           # one rank without FSDP, compiled: 0.45 of the 6.0 GiB bf16 copy held (H100 rows above: 63.80 GiB
                           # at 8 x 6 rowwise needs 0.45, 63.10 tensorwise 0.33; the larger kept)
                           autocast_copy=0.45, measured=MEASURED)

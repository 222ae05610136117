"""The `gr00t` family's memory constants and the GPU runs they were fitted to.

Every measured peak below is torch.cuda.max_memory_allocated over a `trainkit run` on one H200
(the trainer's "peak memory (allocated)", the `steady.peak_mem_gib` of the variant named in the
raw JSON under bench/results/; commands in bench/results/trainkit.md, GR00T section). Calls 1 and
2 ran the n16 preset unless a `model.preset` is set, call 3 (main at 9875678) the n16-h50 one; the
configs' preset is n17 since, so each row names its N1.6 preset. No n17 run is measured yet: its
estimates use these N1.6-fitted constants, UNCALIBRATED for N1.7's VL self-attention blocks, the
whole-sequence cross-attention keys, dropout masks and horizon 40 (bench/plans/gr00t.toml measures them).
`python bench/memory_table.py --fit gr00t --fix backward_block` refits the constants from this
list; bench/results/memory.md shows each run's estimate beside its peak.

What they say: at micro-batch 16 the activations are small beside 1.30B trained parameters, so
the peak is not at the forward/backward turn but at a later moment trainkit/estimate/memory.py
counts byte for byte: the optimiser step under CUDA graphs (16 B per trained parameter and the
bf16 frozen copy: 21.94 GiB estimated, 22.19 measured at horizons 16 and 50 alike), the first DiT
unit's reduce-scatter without graphs, and the one root unit's reduce-scatter in the baseline
(8 B per trained parameter of reduce buffers at world size 1: 29.30 vs 29.45 at both horizons).
At micro-batch 128 the turn is back, and torch.compile saves 0.7x the eager count there.
`backward_block` is pi05's measured 1.302 (the runs never recompute, so it cannot be told apart
from the saved ratio here).
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration, MemoryMeasurement

_R = "bench/results/trainkit_gr00t_call"
OPT, BASE = "gr00t_optimised.toml", "gr00t_baseline.toml"
H50, N16 = "model.preset=n16-h50", "model.preset=n16"


def _m(config: str, sets: tuple[str, ...], peak: float, source: str) -> MemoryMeasurement:
    return MemoryMeasurement(config=config, sets=sets, world_size=1, peak_gib=peak, source=source)


MEASURED = (
    _m(OPT, (N16, "train.micro_batch=16"), 22.19, f"{_R}1.json: optimised_mbs16_graphs"),
    _m(OPT, (N16, "train.micro_batch=16", "parallel.cuda_graphs=false"), 23.82,
       f"{_R}1.json: optimised_mbs16_no_graphs"),
    _m(OPT, (N16,), 31.99, f"{_R}1.json: optimised_mbs128_graphs (all 14 steps ran; the timeout hit its exit)"),
    _m(BASE, (N16,), 29.45, f"{_R}1.json: baseline_mbs16"),
    _m(OPT, (H50, "train.micro_batch=16", "parallel.fsdp_one_rank=false", "parallel.compile=false"), 23.11,
       f"{_R}2.json: n16-h50_optimised_mbs16_graphs (no FSDP, eager, graphs)"),
    _m(OPT, (H50, "train.micro_batch=16"), 22.19, f"{_R}3.json: n16-h50_optimised_mbs16_graphs"),
    _m(OPT, (H50,), 37.85, f"{_R}3.json: n16-h50_optimised_mbs128_graphs"),
    _m(BASE, (H50,), 29.45, f"{_R}3.json: n16-h50_baseline_mbs16"),
)

# fitted by `python bench/memory_table.py --fit gr00t --fix backward_block` to MEASURED, 2026-12-02
MEMORY = MemoryCalibration(saved_compiled=0.7672, saved_eager=1.1628, backward_block=1.302, measured=MEASURED)

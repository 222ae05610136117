"""The `dreamzero` family's memory constants and the GPU runs they were fitted to.

Every measured peak below is torch.cuda.max_memory_allocated over a `trainkit run` of the 5b
preset on one H200 (the trainer's "peak memory (allocated)", `steady.peak_mem_gib` of the variant
named in the raw JSON under bench/results/, main at 9875678, 2026-12-02). The optimised config as
written (micro-batch 4, "blocks" attention) ran out of memory: its row is a lower bound, the
GPU's 139.8 GiB, which the estimate must exceed. `python bench/memory_table.py --fit dreamzero
--fix backward_block` refits the constants; bench/results/memory.md shows each run's estimate.

What they say: the "blocks" attention keeps 2.41 GiB more per sample than "flex" (measured;
2.51 counted by `flops.blocks_attention_extra`), compiled blocks keep about what the eager count
says, and the baseline (one root FSDP unit, every block recomputed) peaks at its reduce-scatter:
8 B per trained parameter of reduce buffers on top of 12 B of weights and AdamW states (93.59 GiB
estimated, 93.74 measured). No run is eager at the turn, so `saved_eager` stays the eager count;
`backward_block` is pi05's measured 1.302 (every run keeps all blocks or recomputes all, so it
cannot be told apart from the saved ratio here).
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration, MemoryMeasurement

_R = "bench/results/trainkit_dreamzero_call1"
OPT, BASE = "dreamzero_5b_optimised.toml", "dreamzero_5b_baseline.toml"
H200_GIB = 139.8  # torch.cuda.get_device_properties(0).total_memory of the H200 (trainkit/estimate/inspect.py)


def _m(config: str, sets: tuple[str, ...], peak: float, source: str, oom: bool = False) -> MemoryMeasurement:
    return MemoryMeasurement(config=config, sets=sets, world_size=1, peak_gib=peak, source=source, out_of_memory=oom)


MEASURED = (
    _m(OPT, (), H200_GIB, f"{_R}.json: optimised (micro-batch 4: out of memory)", oom=True),
    _m(OPT, ("train.micro_batch=3",), 118.25, f"{_R}.json: optimised_mbs3"),
    _m(BASE, (), 93.74, f"{_R}.json: baseline"),
    _m(OPT, ("model.attention=flex", "train.micro_batch=3"), 111.03, f"{_R}_flex.json: flex_mbs3"),
    _m(OPT, ("model.attention=flex", "train.micro_batch=4"), 129.09, f"{_R}_flex.json: flex_mbs4"),
)

# fitted by `python bench/memory_table.py --fit dreamzero --fix backward_block --fix saved_eager` to MEASURED, 2026-12-02
MEMORY = MemoryCalibration(saved_compiled=0.9746, saved_eager=1.0, backward_block=1.302, measured=MEASURED)

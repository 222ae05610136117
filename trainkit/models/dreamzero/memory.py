"""The `dreamzero` family's memory constants and the GPU runs they were fitted to or checked against.

The constants below were fitted (`python bench/gpu/memory_table.py --fit dreamzero --fix backward_block
--fix saved_eager`, 2026-12-02) to five `trainkit run`s of the 5b preset on one H200 when the
family was a shape stand-in of the same Wan block (bench/results/trainkit_dreamzero_call1*.json):
compiled blocks kept 0.975 of the eager count. The family is now DreamZero itself (I2V cross-
attention with image K/V, clean + noisy copies of all 9 latent frames, 5.6B parameters, 4,060
tokens), so those runs measure another model and are not listed as its measurements.
MEASURED holds this model's runs: the first, dreamzero_5b_optimised as shipped (micro-batch 2, no
recompute; main at 898641f, one H200, 2026-12-02 13:39 UTC), peaked at 109.24 GiB, estimated at
114.10 (+4.4%) with the stand-in's constants unchanged. One run cannot separate the constants, so
they are not refitted yet; with more runs of this model (bench/gpu/plans/dreamzero.toml records peak
memory) `bench/gpu/memory_table.py --fit dreamzero` refits them. `backward_block` is pi05's measured 1.302.
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration, MemoryMeasurement

MEASURED = (
    MemoryMeasurement(config="dreamzero_5b_optimised.toml", sets=("train.micro_batch=2",), world_size=1, peak_gib=109.24,
                      source="bench/results/gpu_dreamzero_real_2026-12-02.json: optimised"),
)

MEMORY = MemoryCalibration(saved_compiled=0.9746, saved_eager=1.0, backward_block=1.302, measured=MEASURED)

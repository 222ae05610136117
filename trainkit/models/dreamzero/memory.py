"""The `dreamzero` family's memory constants and the GPU runs they were fitted to.

The constants below were fitted (`python bench/memory_table.py --fit dreamzero --fix backward_block
--fix saved_eager`, 2026-12-02) to five `trainkit run`s of the 5b preset on one H200 when the
family was a shape stand-in of the same Wan block (bench/results/trainkit_dreamzero_call1*.json):
compiled blocks kept 0.975 of the eager count. The family is now DreamZero itself (I2V cross-
attention with image K/V, clean + noisy copies of all 9 latent frames, 5.6B parameters, 4,060
tokens), so those runs measure another model and are not listed as its measurements; the
constants stay as the prior until GPU runs of this model refit them (bench/plans/dreamzero.toml
records peak memory; then `bench/memory_table.py --fit dreamzero`). `backward_block` is pi05's
measured 1.302.
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration

MEMORY = MemoryCalibration(saved_compiled=0.9746, saved_eager=1.0, backward_block=1.302, measured=())

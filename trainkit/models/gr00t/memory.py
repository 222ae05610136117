"""The `gr00t` family's memory constants: UNCALIBRATED for GR00T N1.7.

The constants are the ones fitted (`python bench/gpu/memory_table.py --fit gr00t --fix backward_block`,
2026-12-02) to eight GPU runs of this family's earlier N1.6-shaped model (SigLIP2 tower, 2x2
unshuffle connector, no VL self-attention, horizon 16/50; bench/results/trainkit_gr00t_call{1,2,3}.json,
estimated within 3% then). That model is gone, so those runs are no longer listed as measurements
of this one: N1.7 adds the Qwen3-VL tower with deepstack, 4 VL self-attention blocks over every VL
token, dropout masks and a 40-step horizon, none of which they exercised. bench/gpu/plans/gr00t.toml
measures N1.7's peaks; list them here (`MemoryMeasurement`) and refit.
What the N1.6 runs said, likely to hold: at micro-batch 16 the activations are small beside 1.3B
trained parameters, so the peak is at the optimiser step under CUDA graphs (16 B per trained
parameter and the bf16 frozen copy) or a reduce-scatter, not at the forward/backward turn; at
micro-batch 128 the turn is back, and torch.compile saves 0.77x the eager count there.
"""
from __future__ import annotations

from trainkit.models.family import MemoryCalibration

MEMORY = MemoryCalibration(saved_compiled=0.7672, saved_eager=1.1628, backward_block=1.302)

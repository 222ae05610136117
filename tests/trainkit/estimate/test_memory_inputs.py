"""One home for the memory estimate's inputs (issue 37, item 1): `trainkit tune` ranks settings by
the estimate `trainkit inspect` prints for them, whatever the config switches on.

The oracle is `trainkit inspect` itself (`inspect_model`) of the config with the setting's keys set;
issue 37 found tune leaving out the EMA's fp32 average (`train.ema_decay`, 4 bytes per trained
parameter), so the settings here train with EMA on, with frozen parameters replicated (gr00t) and
with more than one micro-batch per step, each an input the estimate reads.
"""
from __future__ import annotations

import pytest

from datakit.toml_values import toml_value
from trainkit.config import load_config
from trainkit.estimate.inputs import memory_inputs
from trainkit.estimate.inspect import inspect_model
from trainkit.trials.tune import Space, candidates
from trainkit_harness import TINY

GR00T_TINY = TINY.with_name("gr00t_tiny.toml")
EMA = ("train.ema_decay=0.99",)
REPLICATE = ("parallel.frozen=\"replicate\"",)


@pytest.mark.parametrize("config, switches", [
    (TINY, EMA), (TINY, (*EMA, "train.global_batch=32")), (GR00T_TINY, (*EMA, *REPLICATE)),
], ids=["pi05-ema", "pi05-ema-accum", "gr00t-ema-replicate"])
def test_tune_and_inspect_estimate_the_same_with_ema_on(config, switches):
    cfg = load_config(config, list(switches), required=False)
    pool = candidates(cfg, Space(micro_batches=(4, 8), strides=(0, 2), groups=(1,), compile=(False,)), 2)
    assert pool
    for c in pool[::max(1, len(pool) // 6)]:
        sets = [*switches, *(f"{k}={toml_value(v)}" for k, v in c.setting.overlay().items())]
        peak = inspect_model(load_config(config, sets, required=False), world_size=2)["memory"]["peak_gib"]
        assert c.peak(1.0) == pytest.approx(peak, abs=2e-6), c.setting.label()


def test_the_inputs_follow_the_config():
    """Positive control of what the equality rests on: EMA, the FSDP mode on one rank and the
    replicated frozen parameters are read from the config, not assumed."""
    on = memory_inputs(load_config(GR00T_TINY, [*EMA, *REPLICATE], required=False), world_size=1)
    off = memory_inputs(load_config(GR00T_TINY, ["parallel.fsdp_one_rank=false", 'parallel.frozen="shard"'],
                                    required=False), world_size=1)
    assert on.ema and not off.ema
    assert on.mode != "none" and off.mode == "none"
    assert on.replicated == on.total - on.trainable > 0 and off.replicated == 0

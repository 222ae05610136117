"""`data.num_workers` defaults to what the cores allow (issue 35, item 7): pi05_finetune's 4 workers on
a 2-core machine made torch warn ("suggested max number of worker ... is 2") and the run crawl.
-1 (the default, and the GPU presets' value) is min(4, cores per rank - 1); a number is kept as set.
The oracle is the rule written out for each machine shape; through `loader_settings`, what
`TrainData` and `trainkit inspect` build the loader from.
"""
from __future__ import annotations

import pytest
import torch

from trainkit.config import load_config
from trainkit.data import loader_settings, workers_for


@pytest.mark.parametrize("cpus, ranks, want", [(2, 1, 1), (1, 1, 0), (16, 1, 4), (16, 2, 4), (16, 8, 1),
                                               (128, 8, 4)])
def test_minus_one_is_what_the_cores_allow(cpus, ranks, want):
    assert workers_for(-1, cpus, ranks) == want == max(0, min(4, cpus // ranks - 1))
    assert workers_for(3, cpus, ranks) == 3  # as set


@pytest.mark.parametrize("preset", ["pi05_finetune", "pi05_optimised", "pi05_baseline", "gr00t_optimised"])
def test_a_gpu_preset_on_two_cores_starts_one_worker(preset, monkeypatch):
    import datakit.machine

    monkeypatch.setattr(datakit.machine, "available_cpus", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cfg = load_config(preset, ["data.shards=x"], required=False)
    settings = loader_settings(cfg.data, (), seed=0, rank=0, world_size=1, micro_batch=2,
                               image_dtype=torch.float32, pin_memory=False)
    assert settings["num_workers"] == 1


def test_the_default_is_minus_one_and_below_is_refused():
    from trainkit.errors import ConfigError

    assert load_config("pi05_tiny", ["data.shards=x", "data.num_workers=-1"]).data.num_workers == -1
    with pytest.raises(ConfigError, match="data.num_workers"):
        load_config("pi05_tiny", ["data.shards=x", "data.num_workers=-2"])

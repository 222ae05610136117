"""The memory estimate (trainkit/estimate/memory.py through `inspect_model`) against the GPU: every run a
family's record lists as measured (torch.cuda.max_memory_allocated on H200s) is estimated within
10%; and its shape: more samples never cost less, more recompute never costs more."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainkit.config import load_config
from trainkit.estimate.inspect import inspect_model
from trainkit.models import FAMILIES

pytestmark = pytest.mark.timeout(300)

CONFIGS = Path(__file__).resolve().parents[1] / "trainkit" / "configs"
MEASURED = [(name, m) for name, fam in sorted(FAMILIES.items()) for m in fam.memory.measured]


def _peak(config: str, sets: list[str], world: int = 1) -> float:
    return inspect_model(load_config(CONFIGS / config, sets, required=False), world_size=world)["memory"]["peak_gib"]


@pytest.mark.parametrize("name,m", MEASURED, ids=[f"{n}:{m.config}:{','.join(m.sets)}:w{m.world_size}"
                                                  for n, m in MEASURED])
def test_every_measured_run_is_estimated_within_10_percent(name, m):
    est = _peak(m.config, list(m.sets), m.world_size)
    assert abs(est / m.peak_gib - 1) <= 0.10, f"{name} {m.source}: estimate {est:.2f} GiB, measured {m.peak_gib:.2f}"


def test_pi05_has_measurements_at_both_world_sizes():
    assert {m.world_size for m in FAMILIES["pi05"].memory.measured} >= {1, 2}


@pytest.mark.parametrize("config,preset", [("pi05_tiny.toml", "tiny"), ("pi05_tiny.toml", "tiny_deep"),
                                           ("pi05_optimised.toml", "full")])
def test_monotone_in_micro_batch(config, preset):
    for compiled in ("true", "false"):
        peaks = [_peak(config, [f"model.preset={preset}", f"train.micro_batch={b}", f"parallel.compile={compiled}"])
                 for b in (1, 2, 3, 8, 16, 40)]
        assert all(a < b for a, b in zip(peaks, peaks[1:])), peaks


@pytest.mark.parametrize("config,preset", [("pi05_tiny.toml", "tiny"), ("pi05_tiny.toml", "tiny_deep"),
                                           ("pi05_optimised.toml", "full")])
def test_monotone_in_recompute(config, preset):
    """Every stride recomputes a superset of the blocks of the stride listed after it (0 = none),
    so the peak may only fall down the list; every block of every list recomputed is below none
    (one list alone may not lower it: tiny's fullest moment is the first LM layer's backward)."""
    for lists in ({"vision_blocks"}, {"lm_layers"}, {"vision_blocks", "lm_layers"}):
        peaks = []
        for stride in (0, 8, 4, 2, 1):
            table = "{" + ", ".join(f"{k} = {stride if k in lists else 0}" for k in ("vision_blocks", "lm_layers")) + "}"
            peaks.append(_peak(config, [f"model.preset={preset}", "train.micro_batch=8", f"parallel.ac_stride={table}"]))
        assert all(a >= b for a, b in zip(peaks, peaks[1:])), (lists, peaks)
        assert peaks[-1] < peaks[0] or len(lists) == 1, (lists, peaks)

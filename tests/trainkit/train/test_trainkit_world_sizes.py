"""Every family's `optimised` switches at world size 2 train the same model as at world size 1 with
the same global batch (2 gloo processes; FSDP2 on CPU). The oracle is the one-process run: the
loader's global sample order does not depend on the world size, so the only difference allowed is
the summation order of the gradient reduce (2 shards of 4 samples, against 2 micro-batches of 4
accumulated on one rank).

Each family's case is its tiny config, the switches its `optimised` config turns on that run on
the CPU, and its tolerance with the figure it was set from.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import ROOT, run_distributed, tiny_config

STEPS = 8
GLOBAL_BATCH = 8


@dataclass(frozen=True)
class Case:
    config: Path  # the family's tiny config
    optimised: tuple[str, ...]  # its optimised switches that run on the CPU
    tolerance: float  # max |loss(world 2) - loss(world 1)| over the resumed steps
    shards: str = "shards_rgb"  # the session fixture of its shards


CASES = {
    # float32 throughout; measured max |diff| 0.0 over 7 steps (torch 2.13 CPU; a grad_clip of 0.5 on one
    # side moves it 3e-4): the tolerance leaves room for other BLAS builds and reduce orders.
    "pi05": Case(ROOT / "trainkit" / "configs" / "pi05_tiny.toml",
                 ("parallel.fsdp=block", "parallel.group={vision_blocks = 2, lm_layers = 1}",
                  "parallel.prefetch=true", "parallel.ac_stride={vision_blocks = 2, lm_layers = 0}",
                  "data.h2d_dtype=uint8", "data.prune_slots=true", "optim.fused=true"),
                 1e-5),
    # float32; measured max |diff| 0.0 over 7 steps (torch 2.13 CPU).
    "dreamzero": Case(ROOT / "trainkit" / "configs" / "dreamzero_tiny.toml",
                      ("parallel.fsdp=block", "parallel.prefetch=true", "parallel.ac_stride={}",
                       "data.h2d_dtype=uint8", "optim.fused=true"),
                      1e-5, shards="shards_3cam"),
    # float32, frozen parts replicated on every rank; measured max |diff| 0.0 over 7 steps (torch 2.13 CPU).
    "gr00t": Case(ROOT / "trainkit" / "configs" / "gr00t_tiny.toml",
                  ("parallel.fsdp=block", "parallel.frozen=replicate", "parallel.group={lm_layers = 2, vl_blocks = 2, dit_blocks = 2}",
                   "parallel.ac_stride={dit_blocks = 2}", "data.h2d_dtype=uint8", "data.prune_slots=true",
                   "optim.fused=true"),
                  1e-5),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", sorted(CASES))
def test_world_size_two_trains_as_world_size_one(family, request, tmp_path):
    """Both runs resume one checkpoint (saved by a 2-rank run after its first step; DCP reshards it
    to 1 rank), so the reshard is checked too. The random init is the same at both world sizes
    (trainkit/parallel/init.py; test_trainkit_parallel.py compares it tensor by tensor)."""
    case = CASES[family]
    shards = request.getfixturevalue(case.shards)
    common = (f"train.global_batch={GLOBAL_BATCH}", "train.micro_batch=4", "optim.schedule=constant",
              "output.log_every=1", "output.checkpoint_every=1", "output.resume=true", *case.optimised)
    start = tmp_path / "start"
    [first] = run_distributed([tiny_config(shards, start, *common, "train.steps=1", config=case.config)], world=2)
    assert "error" not in first, first["error"]
    for name in ("world1", "world2"):
        shutil.copytree(start, tmp_path / name)

    def cfg(name: str):
        return tiny_config(shards, tmp_path / name, *common, f"train.steps={STEPS}", config=case.config)

    [one] = run_distributed([cfg("world1")], world=1)  # 2 micro-batches of 4, accumulated
    [two] = run_distributed([cfg("world2")], world=2)  # 4 samples per rank
    assert "error" not in one and "error" not in two, (one.get("error"), two.get("error"))
    assert one["start_step"] == two["start_step"] == 1
    steps = list(range(1, STEPS))
    assert sorted(one["losses"]) == sorted(two["losses"]) == steps
    assert all(math.isfinite(one["losses"][s]) for s in steps)
    diffs = [abs(one["losses"][s] - two["losses"][s]) for s in steps]
    assert max(diffs) <= case.tolerance, diffs

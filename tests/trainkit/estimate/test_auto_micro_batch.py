"""train.micro_batch = "auto" (trainkit/estimate/auto_batch.py) on the CPU, with a stated GPU memory.

Oracle: `inspect_model`'s estimate of each candidate micro-batch, computed here one by one; the
memory stated is put between two candidates' estimates (less the headroom), so exactly one is the
right choice. The trainer's run with "auto" is held to the run with that micro-batch written out:
the same losses bit for bit (the global batch, hence the accumulation, unchanged).
"""
import dataclasses

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import tiny_config

from trainkit.cli import main
from trainkit.config import load_config
from trainkit.errors import ConfigError, LaunchError
from trainkit.estimate.auto_batch import candidates, choose_micro_batch, resolve_micro_batch
from trainkit.estimate.inspect import inspect_model

GLOBAL = 8
SETS = ["train.micro_batch=auto", f"train.global_batch={GLOBAL}"]


def _peak(cfg, micro: int) -> float:
    c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch=micro))
    return inspect_model(c, world_size=1, gpu=("x", 1e9))["memory"]["peak_gib"]


def _between(cfg, micro: int, larger: int) -> float:
    """A card memory at which `micro` fits less the headroom and `larger` does not."""
    lo, hi = _peak(cfg, micro), _peak(cfg, larger)
    assert lo < hi
    return (lo + hi) / 2 / (1.0 - cfg.train.memory_headroom)


def test_candidates_divide_the_global_batch_largest_first():
    assert candidates(48, 1) == [48, 24, 16, 12, 8, 6, 4, 3, 2, 1]
    assert candidates(48, 2) == [24, 12, 8, 6, 4, 3, 2, 1]
    assert candidates(0, 1)[:3] == [1024, 512, 256] and candidates(0, 1)[-1] == 1
    with pytest.raises(LaunchError, match="not divisible by the world size 3"):
        candidates(8, 3)


def test_the_largest_micro_batch_that_fits_keeps_the_global_batch():
    cfg = load_config("pi05_tiny", SETS, required=False)
    gib = _between(cfg, 2, 4)
    choice = choose_micro_batch(cfg, 1, ("card", gib))
    assert (choice.micro_batch, choice.accum, choice.global_batch) == (2, 4, GLOBAL)
    assert choice.peak_gib == _peak(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch=2)), 2)
    assert [m for m, _ in choice.larger] == [8, 4]
    resolved, same = resolve_micro_batch(cfg, 1, ("card", gib))
    assert (resolved.train.micro_batch, resolved.train.global_batch) == (2, GLOBAL) and same == choice
    # more memory: the next candidate; the whole global batch when everything fits
    assert choose_micro_batch(cfg, 1, ("card", _between(cfg, 4, 8))).micro_batch == 4
    assert choose_micro_batch(cfg, 1, ("card", 1e6)).micro_batch == GLOBAL
    # the headroom is applied: the same card with no headroom fits more
    roomy = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, memory_headroom=0.0))
    assert choose_micro_batch(roomy, 1, ("card", _peak(cfg, 4))).micro_batch == 4
    assert choose_micro_batch(cfg, 1, ("card", _peak(cfg, 4))).micro_batch == 2


def test_without_a_global_batch_the_largest_power_of_two_and_no_accumulation():
    cfg = load_config("pi05_tiny", ["train.micro_batch=auto"], required=False)
    choice = choose_micro_batch(cfg, 1, ("card", _between(cfg, 16, 32)))
    assert (choice.micro_batch, choice.accum, choice.global_batch) == (16, 1, 16)


def test_nothing_fits_is_refused_in_one_line():
    cfg = load_config("pi05_tiny", SETS, required=False)
    with pytest.raises(LaunchError) as e:
        choose_micro_batch(cfg, 1, ("card", _peak(cfg, 1) * 0.5))
    assert "nothing fits card" in str(e.value) and "micro-batch 1 is estimated" in str(e.value)
    assert "\n" not in str(e.value)


def test_config_accepts_auto_and_numbers_only():
    assert load_config("pi05_tiny", ["train.micro_batch=16"], required=False).train.micro_batch == 16
    assert load_config("pi05_tiny", ["train.micro_batch=auto"], required=False).train.micro_batch == "auto"
    with pytest.raises(ConfigError, match="train.micro_batch"):
        load_config("pi05_tiny", ["train.micro_batch=big"], required=False)
    with pytest.raises(ConfigError, match="train.micro_batch"):
        load_config("pi05_tiny", ["train.micro_batch=0"], required=False)
    with pytest.raises(ConfigError, match="train.memory_headroom"):
        load_config("pi05_tiny", ["train.memory_headroom=1.0"], required=False)


def test_inspect_prints_the_choice_without_a_gpu(capsys):
    cfg = load_config("pi05_tiny", SETS, required=False)
    gib = _between(cfg, 2, 4)
    assert main(["inspect", "pi05_tiny", *(a for s in SETS for a in ("--set", s)), "--gpu-memory-gib", str(gib)]) == 0
    out = capsys.readouterr().out
    assert f"train.micro_batch auto: 2 (x 4 accumulation x 1 rank = global batch {GLOBAL})" in out
    assert "memory estimate per GPU (world 1, micro-batch 2," in out
    # nothing fits one rank: inspect still reports (the smallest micro-batch, the refusal, where it fits
    # from); the trainer refuses (choose_micro_batch: test_nothing_fits_is_refused_in_one_line)
    assert main(["inspect", "pi05_tiny", *(a for s in SETS for a in ("--set", s)), "--gpu-memory-gib",
                 str(_peak(cfg, 1) * 0.5)]) == 0
    out = capsys.readouterr().out
    assert "train.micro_batch auto: nothing fits" in out and "memory estimate per GPU (world 1, micro-batch 1," in out


@pytest.mark.parametrize("preset,gib,micro", [("pi05_optimised", 141, 48), ("pi05_optimised", 80, 12),
                                              ("gr00t_optimised", 80, 128), ("dreamzero_5b_optimised", 141, 2)])
def test_optimised_presets_choose_from_the_card(preset, gib, micro):
    report = inspect_model(load_config(preset, required=False), world_size=1, gpu=("card", gib))
    chosen = report["auto_micro_batch"]
    assert chosen["micro_batch"] == micro == report["micro_batch"]
    assert report["memory"]["peak_gib"] <= gib * 0.9


def test_the_run_trains_the_chosen_micro_batch_bit_for_bit(shards_rgb, tmp_path, monkeypatch, capsys):  # noqa: F811
    from trainkit.estimate import inspect as inspect_module
    from trainkit.train import run
    common = ("train.steps=2", "output.log_every=1", "parallel.fsdp=none", "optim.schedule=constant")
    auto = tiny_config(shards_rgb, tmp_path / "auto", *common, *SETS)
    gib = _between(auto, 2, 4)
    monkeypatch.setattr(inspect_module, "device_memory", lambda device: ("stated card", gib))
    got = run(auto)
    assert "train.micro_batch auto: 2 (x 4 accumulation" in capsys.readouterr().err
    want = run(tiny_config(shards_rgb, tmp_path / "fixed", *common, "train.micro_batch=2", f"train.global_batch={GLOBAL}"))
    assert got.losses == want.losses and len(got.losses) == 2
    assert got.summary["global_batch"] == GLOBAL

"""trainkit run on the tiny preset, 2 gloo processes (FSDP2 on CPU), over shards converted from a
generated dataset (the loader tests' fixture: synth AV1 videos -> datakit convert; 3 cameras, the
`side` one blank in every episode, so pruning drops it).

One process group trains several runs (`run_distributed`), so the suite starts processes once:
- baseline (one FSDP unit, recompute everything, fp32 host normalisation, padded slots, plain
  AdamW) and optimised (per-block FSDP with grouping and prefetch, strided recompute, uint8 to
  the device, pruned slots, fused AdamW), 36 steps each from the same seed;
- the optimised run again, stopped after 18 steps with checkpoints, then resumed to 36;
- tiny_deep (the full preset's 27 / 18 block counts) for 2 steps under three wrappings, with
  all-gathers counted as torch.distributed sees them;
- a two-source mixture for 3 steps, its loss per source summed over both ranks.
Oracles: the other run (same losses), the block counts (all-gathers), the unbroken run (resume).
"""
import json
import math
import statistics
from pathlib import Path

import pytest

from loader_fixtures import shards_b, shards_rgb  # noqa: F401 - session fixtures
from trainkit_harness import ROOT, run_distributed, tiny_config

from trainkit.estimate.inspect import inspect_model

STEPS = 36
# baseline vs optimised: the same math in float32 with different summation orders (masked vs pruned
# slot, fused vs foreach AdamW, one vs many reduce-scatters). Measured max |diff| over 20 steps:
# 1.2e-7 (torch 2.13 CPU); the tolerance leaves ~100x room for other BLAS builds.
LOSS_TOL = 1e-5

BASELINE = ("parallel.fsdp=root", "parallel.prefetch=false", "parallel.ac_stride={vision_blocks = 1, lm_layers = 1}",
            "data.h2d_dtype=float32", "data.prune_slots=false", "optim.fused=false")
OPTIMISED = ("parallel.fsdp=block", "parallel.group={vision_blocks = 2, lm_layers = 1}", "parallel.prefetch=true",
             "parallel.ac_stride={vision_blocks = 2, lm_layers = 0}", "data.h2d_dtype=uint8", "data.prune_slots=true",
             "optim.fused=true")
COMMON = (f"train.steps={STEPS}", "optim.schedule=constant", "output.resume=true")


@pytest.fixture(scope="module")
def runs(shards_rgb, shards_b, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("trainkit_runs")
    cfgs = {
        "baseline": tiny_config(shards_rgb, tmp / "baseline", *COMMON, *BASELINE),
        "optimised": tiny_config(shards_rgb, tmp / "optimised", *COMMON, *OPTIMISED),
        "resume_first": tiny_config(shards_rgb, tmp / "resumed", *COMMON, *OPTIMISED, "train.steps=18",
                                    "output.checkpoint_every=9"),
        "resume_second": tiny_config(shards_rgb, tmp / "resumed", *COMMON, *OPTIMISED, "output.checkpoint_every=9"),
    }
    for name, group in (("deep_g4", 4), ("deep_g1", 1)):
        cfgs[name] = tiny_config(shards_rgb, tmp / name, "model.preset=tiny_deep", "train.steps=2", "output.log_every=1",
                                 "parallel.fsdp=block", f"parallel.group={{vision_blocks = {group}, lm_layers = 1}}",
                                 "parallel.ac_stride={}")
    cfgs["deep_g4_keep"] = tiny_config(shards_rgb, tmp / "deep_g4_keep", "model.preset=tiny_deep", "train.steps=2",
                                       "output.log_every=1", "parallel.fsdp=block", "parallel.reshard_after_forward=false",
                                       "parallel.group={vision_blocks = 4, lm_layers = 1}", "parallel.ac_stride={}")
    cfgs["deep_root"] = tiny_config(shards_rgb, tmp / "deep_root", "model.preset=tiny_deep", "train.steps=2",
                                    "output.log_every=1", "parallel.fsdp=root", "parallel.ac_stride={}")
    # a mixture of two datasets (other cameras and sizes), each step logged: its loss per source
    mixture = (f'data.sources=[{{shards = "{shards_rgb}", weight = 0.6, name = "a"}}, '
               f'{{shards = "{shards_b}", weight = 0.4, name = "b", slots = ["cam.hand", "cam.front"]}}]')
    cfgs["mixture"] = tiny_config(shards_rgb, tmp / "mixture", mixture, "train.steps=3", "output.log_every=1",
                                  *OPTIMISED)
    results = run_distributed(list(cfgs.values()), world=2)
    out = dict(zip(cfgs, results))
    errors = {k: r["error"] for k, r in out.items() if "error" in r}
    assert not errors, errors
    out["resumed_dir"] = tmp / "resumed"
    out["dirs"] = {k: Path(c.output.dir) for k, c in cfgs.items()}
    out["cfgs"] = cfgs
    return out


def _losses(run, steps):
    return [run["losses"][s] for s in steps]


@pytest.mark.timeout(300)
def test_loss_goes_down(runs):
    losses = _losses(runs["optimised"], range(STEPS))
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert all(math.isfinite(x) for x in losses)
    assert last < 0.8 * first, (first, last)


@pytest.mark.timeout(300)
def test_baseline_and_optimised_give_the_same_losses(runs):
    base, opt = _losses(runs["baseline"], range(20)), _losses(runs["optimised"], range(20))
    diff = max(abs(a - b) for a, b in zip(base, opt))
    assert diff < LOSS_TOL, (diff, base, opt)
    assert runs["baseline"]["applied"] == ["activation_checkpointing", "fsdp_root"]
    assert runs["optimised"]["applied"] == ["activation_checkpointing", "fsdp_block", "prefetch"]


@pytest.mark.timeout(300)
def test_resume_gives_the_losses_of_the_unbroken_run(runs):
    unbroken, first, second = runs["optimised"], runs["resume_first"], runs["resume_second"]
    assert second["start_step"] == 18
    assert sorted(first["losses"]) == list(range(18)) and sorted(second["losses"]) == list(range(18, STEPS))
    assert _losses(first, range(18)) == _losses(unbroken, range(18))
    assert _losses(second, range(18, STEPS)) == _losses(unbroken, range(18, STEPS))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, vision_units, per_unit", [("deep_g4", math.ceil(27 / 4), 2), ("deep_g1", 27, 2),
                                                           ("deep_g4_keep", math.ceil(27 / 4), 1), ("deep_root", None, 0)])
def test_all_gathers_per_step_follow_the_wrapping(runs, name, vision_units, per_unit):
    """Counted all-gathers = 2 per block unit (forward, and again in backward after resharding;
    1 when units keep their parameters to backward) + 1 for the root (not resharded after
    forward); the root alone is one."""
    expected = 1 if vision_units is None else per_unit * (vision_units + 18) + 1
    counted = [h["all_gathers_per_step"] for h in runs[name]["history"]]
    assert counted == [expected, expected]
    assert runs[name]["all_gathers_per_step"] == expected
    # `trainkit inspect` at the run's world size says what the run counted
    assert inspect_model(runs["cfgs"][name], world_size=2)["fsdp"]["all_gathers_per_step"] == expected


@pytest.mark.timeout(120)
def test_resume_with_another_world_size_and_global_batch_is_refused(runs, shards_rgb, capsys):  # noqa: F811
    from trainkit.cli import main

    out = runs["resumed_dir"]
    code = main(["run", str(ROOT / "trainkit" / "configs" / "pi05_tiny.toml"), "--set", f"data.shards={shards_rgb}",
                 "--set", f"output.dir={out}", "--set", "data.num_workers=0", *[x for o in OPTIMISED for x in ("--set", o)],
                 "--set", f"train.steps={STEPS + 2}"])
    err = capsys.readouterr().err
    assert code == 2 and "written by 2 ranks with global batch 8, this run has 1 ranks and global batch 4" in err, err


def test_summary_json_holds_the_steady_state_of_metrics_jsonl(runs):
    """summary.json (rank 0, end of run) against metrics.jsonl read back with the stdlib: medians of
    every interval after the first, the run's peak memory, first and last step loss."""
    out = runs["dirs"]["optimised"]
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    intervals = [x for x in lines if x["kind"] == "interval"]
    steps = [x for x in lines if x["kind"] == "step"]
    assert len(intervals) >= 3 and len(steps) == STEPS
    steady = summary["steady"]
    for key in ("step_time_s", "samples_per_s_gpu", "data_wait_frac", "all_gathers_per_step"):
        assert steady[key] == pytest.approx(statistics.median(x[key] for x in intervals[1:])), key
    assert steady["from_step"] == intervals[1]["step"] + 1 - intervals[1]["steps"]
    # gloo on CPU: no peak FLOPs and no allocator count, so null in both files (printed n/a), not 0
    assert steady["mfu"] is None and {x["mfu"] for x in intervals} == {None}
    assert steady["peak_mem_gib"] is None and {x["peak_mem_gib"] for x in intervals} == {None}
    assert (summary["first_loss"], summary["last_loss"]) == (steps[0]["loss"], steps[-1]["loss"])
    assert (summary["world_size"], summary["steps_run"], summary["preset"]) == (2, STEPS, "tiny")


def test_a_mixtures_loss_per_source_counts_the_samples_of_both_ranks(runs):
    """Oracle: the step loss (the mean over both ranks' samples): with one metric line per step, the
    per-source means weighted by their counts are it (pi05's samples are of one size)."""
    run = runs["mixture"]
    assert [h["step"] for h in run["history"]] == [0, 1, 2]
    for h in run["history"]:
        counts = {k.removeprefix("samples/"): n for k, n in h.items() if k.startswith("samples/")}
        assert set(counts) == {"a", "b"} and sum(counts.values()) == 8  # 2 ranks x micro-batch 4
        mean = sum(h[f"loss/{name}"] * n for name, n in counts.items() if n) / 8
        assert mean == pytest.approx(run["losses"][h["step"]], rel=1e-5)

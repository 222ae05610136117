"""`trainkit.estimate.inspect` against counts derived by hand: FSDP units and all-gathers from the wrapping
and grouping at the full block counts (tiny_deep: 27 SigLIP blocks, 18 MoT layers), and the memory
estimate's exact parts (16 bytes of fp32 params + grads + AdamW states per parameter, sharded)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainkit.estimate.inspect import format_report, inspect_model
from trainkit.models import build_model
from trainkit.errors import ModelConfigError
from trainkit.models.pi05 import PRESETS, flops_per_sample

pytestmark = pytest.mark.timeout(120)


def run_config(preset="tiny_deep", fsdp="block", group=None, ac=None, slots=(), prune=True, micro=4,
               global_batch=0, dtype="bfloat16", reshard=True):
    return SimpleNamespace(
        model=SimpleNamespace(family="pi05", preset=preset),
        data=SimpleNamespace(slots=list(slots), prune_slots=prune),
        train=SimpleNamespace(micro_batch=micro, global_batch=global_batch),
        parallel=SimpleNamespace(fsdp=fsdp, group=group or {}, ac_stride=ac or {}, param_dtype=dtype, compile=False,
                                   reshard_after_forward=reshard))


# (fsdp, group, units, all-gathers per micro-batch), derived by hand:
# block, vision g: ceil(27 / g) vision units + 18 LM units + 1 root; forward gathers each unit,
# backward re-gathers the non-root ones (the root stays gathered after forward).
CASES = [
    ("block", {}, 27 + 18 + 1, 46 + 45),                                     # 91
    ("block", {"vision_blocks": 4}, 7 + 18 + 1, 26 + 25),                    # 51: 4*6 + 3
    ("block", {"vision_blocks": 4, "lm_layers": 2}, 7 + 9 + 1, 17 + 16),     # 33
    ("block", {"vision_blocks": 27, "lm_layers": 18}, 3, 3 + 2),             # 5
    ("block", {"vision_blocks": 5}, 6 + 18 + 1, 25 + 24),                    # 27 = 5*5 + 2
    ("root", {}, 1, 1),
    ("none", {}, 0, 0),
]


@pytest.mark.parametrize("fsdp,group,units,gathers", CASES)
def test_units_and_all_gathers_follow_wrapping_and_grouping(fsdp, group, units, gathers):
    report = inspect_model(run_config(fsdp=fsdp, group=group), world_size=2)
    assert report["fsdp"]["units"] == units
    assert report["fsdp"]["all_gathers_per_microbatch"] == gathers
    assert report["fsdp"]["reduce_scatters_per_microbatch"] == units


def test_no_reshard_after_forward_gathers_each_unit_once():
    """Units kept gathered from forward to backward are not re-gathered: 7 + 18 + 1 = 26."""
    report = inspect_model(run_config(group={"vision_blocks": 4}, reshard=False), world_size=2)
    assert report["fsdp"]["all_gathers_per_microbatch"] == 26
    full = inspect_model(run_config(preset="full", group={"vision_blocks": 4}, reshard=False), world_size=2)
    assert full["memory"]["gathered_params_gib"] == pytest.approx(2 * full["params"]["total"] / 2**30, rel=1e-3)


def test_gradient_accumulation_multiplies_gathers_per_step():
    report = inspect_model(run_config(group={"vision_blocks": 4}, micro=4, global_batch=32), world_size=2)
    assert report["fsdp"]["grad_accum_steps"] == 4  # 32 / (4 x 2)
    assert report["fsdp"]["all_gathers_per_step"] == 4 * 51


def test_unit_sizes_add_up_to_the_model():
    with torch.device("meta"):
        model = build_model("pi05", "tiny_deep")
    total = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.vision_blocks[0].parameters())
    report = inspect_model(run_config(group={"vision_blocks": 4}), world_size=2)
    assert report["params"]["total"] == total
    assert report["fsdp"]["root_params"] + sum(report["params"]["by_part"][k] for k in ("vision_blocks", "lm_layers")) == total
    # largest unit: 4 vision blocks or one full MoT layer, whichever is bigger
    layer = sum(p.numel() for p in model.lm_layers[0].parameters())
    assert report["fsdp"]["largest_unit_params"] == max(4 * block, layer)


def test_recompute_indices_follow_stride():
    report = inspect_model(run_config(ac={"vision_blocks": 4, "lm_layers": 1}), world_size=1)
    assert report["recompute"]["vision_blocks"] == [0, 4, 8, 12, 16, 20, 24]
    assert report["recompute"]["lm_layers"] == list(range(18))


def test_memory_estimate_parts():
    cfg = run_config(preset="full", group={"vision_blocks": 4}, micro=8)
    rep = {w: inspect_model(cfg, world_size=w) for w in (1, 2, 8)}
    total = rep[1]["params"]["total"]
    for w, r in rep.items():  # fp32 params 4 B, AdamW m and v 8 B, sharded over w; no grads at the peak
        m = r["memory"]
        assert m["params_gib"] + m["optimizer_gib"] == pytest.approx(12 * total / w / 2**30, rel=1e-3)
        assert m["grads_gib"] == 0
    accum = inspect_model(run_config(preset="full", group={"vision_blocks": 4}, micro=8, global_batch=32), 2)["memory"]
    assert accum["grads_gib"] == pytest.approx(4 * total / 2 / 2**30, rel=1e-3)  # fp32 grads live across micro-batches
    with_ac = inspect_model(run_config(preset="full", micro=8, ac={"vision_blocks": 1, "lm_layers": 1}), 2)["memory"]
    no_ac = rep[2]["memory"]
    assert with_ac["activations_gib"] < no_ac["activations_gib"] / 10
    assert no_ac["activations_gib"] == pytest.approx(no_ac["activations_no_recompute_gib"], rel=1e-3)
    assert with_ac["activations_gib"] == pytest.approx(with_ac["activations_full_recompute_gib"], rel=1e-3)
    double = inspect_model(run_config(preset="full", group={"vision_blocks": 4}, micro=16), 2)["memory"]
    assert double["activations_gib"] == pytest.approx(2 * no_ac["activations_gib"], rel=1e-3)
    root = inspect_model(run_config(preset="full", fsdp="root", micro=8), 2)["memory"]
    assert root["gathered_params_gib"] == pytest.approx(2 * total / 2**30, rel=1e-3)  # whole model in bf16
    assert root["peak_gib"] > no_ac["peak_gib"] - no_ac["activations_gib"]


def test_slots_tokens_and_flops():
    cfg = run_config(preset="full", slots=["cam_high", "cam_wrist", ""], prune=True)
    report = inspect_model(cfg, world_size=2)
    assert report["slots_max"] == 2  # the never-filled slot is pruned
    assert report["tokens_per_sample"]["2"] == {"vision": 512, "prefix": 712, "suffix": 50, "sequence": 762}
    assert report["flops_per_sample"]["2"] == flops_per_sample(PRESETS["full"](), 2)
    assert inspect_model(run_config(preset="full", slots=["a", "b", ""], prune=False), 2)["slots_max"] == 3
    assert "51 per micro-batch" in format_report(inspect_model(run_config(group={"vision_blocks": 4}), 2))


def test_bad_names_are_refused():
    with pytest.raises(ModelConfigError, match="vision_block"):
        inspect_model(run_config(group={"vision_block": 4}), 2)
    with pytest.raises(ModelConfigError, match="ac_stride"):
        inspect_model(run_config(ac={"lm": 1}), 2)


def test_world_size_one_counts_no_collectives():
    """FSDP2 on one rank gathers nothing (the run counts 0: test_trainkit_output.py); the count at
    world size > 1 stays in its own field: tiny_deep, vision grouped by 4: 2 x (7 + 18) + 1 = 51."""
    cfg = run_config(group={"vision_blocks": 4})
    one, two = inspect_model(cfg, world_size=1)["fsdp"], inspect_model(cfg, world_size=2)["fsdp"]
    assert (one["all_gathers_per_microbatch"], one["all_gathers_per_step"], one["reduce_scatters_per_microbatch"]) == (0, 0, 0)
    assert one["sharded_all_gathers_per_microbatch"] == two["all_gathers_per_microbatch"] == 51
    assert "no all-gather or reduce-scatter at world size 1" in format_report(inspect_model(cfg, world_size=1))


def test_tiny_memory_is_printed_in_mib():
    """Tiny: 165k params, so fp32 params take 0.6 MiB (0.0 GiB); every memory figure keeps digits."""
    report = inspect_model(run_config(preset="tiny", dtype="float32"), world_size=1)
    text = format_report(report)
    params_mib = 4 * report["params"]["total"] / 2**20
    assert 0.55 < params_mib < 0.7 and f"params {params_mib:.1f} MiB" in text
    assert "0.0 GiB" not in text and f"peak {report['memory']['peak_gib'] * 1024:.1f} MiB" in text


def test_estimate_over_the_gpu_memory_warns_with_the_world_size_that_fits():
    """The optimised shape, eager, at micro-batch 48 estimates 153.8 GiB on one rank: over an H200's 139.8 GiB
    (what torch reported on the device); 2 ranks shard 18.1 GiB of params and AdamW states away."""
    cfg = run_config(preset="full", group={"vision_blocks": 4}, micro=48, slots=["a", "b", ""])
    one = inspect_model(cfg, world_size=1, gpu=("NVIDIA H200", 139.8))
    assert one["memory"]["peak_gib"] > 139.8 and not one["memory"]["fits"]
    two = inspect_model(cfg, world_size=2, gpu=("NVIDIA H200", 139.8))
    assert two["memory"]["fits"] and one["memory"]["fits_from_world_size"] == 2
    text = format_report(one)
    assert (f"WARNING: the estimated peak {one['memory']['peak_gib']:.1f} GiB exceeds the 139.8 GiB of one NVIDIA H200 "
            f"at world size 1: at --world-size 2 it is {two['memory']['peak_gib']:.1f} GiB") in text
    assert "WARNING" not in format_report(two)
    small = inspect_model(cfg, world_size=1, gpu=("small", 40.0))  # activations alone exceed it
    assert small["memory"]["activations_gib"] > 40 and small["memory"]["fits_from_world_size"] is None
    assert "more GPUs do not fix it" in format_report(small)


def test_zero_grads_at_the_turn_say_why():
    """inspect printed "grads 0 GiB" for 3.24B trainable parameters without a word: the line says none
    exists yet at the turn, and where they all are: 4 B per trained parameter (fp32), at the optimiser step."""
    report = inspect_model(run_config(preset="full", group={"vision_blocks": 4}, micro=8), world_size=2)
    m, trained = report["memory"], report["params"]["trainable"]
    assert m["moment"] == "turn" and m["grads_gib"] == 0
    all_grads = 4 * trained / 2 / 2**30
    (why,) = [line for line in format_report(report).splitlines() if line.startswith("  grads 0 GiB")]
    assert "none exists yet" in why and f"all {all_grads:.1f} GiB are alive at the optimiser step" in why, why
    # gradient accumulation keeps them at the turn: counted there, nothing to explain
    accum = inspect_model(run_config(preset="full", group={"vision_blocks": 4}, micro=8, global_batch=32), 2)
    assert accum["memory"]["grads_gib"] > 0 and "none exists yet" not in format_report(accum)

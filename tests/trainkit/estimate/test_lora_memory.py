"""The memory estimate of LoRA runs (trainkit/estimate/memory.py, inspect.py; the families' "lora"
terms) and `trainkit inspect` of every DreamZero preset on an 80 GB and a 141 GB card.

- A LoRA run's weights: the frozen base at 2 bytes (bf16, replicated, no gradient, no AdamW state),
  the trained parameters at 4 + 8 bytes (fp32 master + AdamW m, v); FSDP units hold only those.
- The LoRA presets fit one 80 GB card with micro-batch >= 2 at world size 1; every DreamZero preset
  shows a setting that fits each card (world size 1, or the least world size `fits_from_world_size`).
- The "lora" terms: DreamZero's adds the adapters' rank-r hiddens; pi05's takes away the frozen
  prefix (no gradient reaches it, so autograd keeps nothing of it).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from trainkit.config import load_config
from trainkit.estimate.inspect import inspect_model
from trainkit.models import build_model, family

CONFIGS = Path(__file__).resolve().parents[3] / "trainkit" / "configs"
DREAMZERO = sorted(p.stem for p in CONFIGS.glob("dreamzero_*.toml"))
LORA = ("dreamzero_5b_lora", "dreamzero_14b_lora", "pi05_lora")
GIB = 2 ** 30


def inspect(name: str, gib: float, *sets: str) -> dict:
    cfg = load_config(CONFIGS / f"{name}.toml", ["model.init_from=", "data.shards=unused", *sets])
    return inspect_model(cfg, 1, gpu=("test card", gib))


@pytest.mark.parametrize("gib", [80.0, 141.0])
@pytest.mark.parametrize("name", DREAMZERO)
def test_every_dreamzero_preset_shows_a_setting_that_fits(name, gib):
    mem = inspect(name, gib)["memory"]
    assert mem["fits"] or mem["fits_from_world_size"] is not None, (name, mem["peak_gib"])
    if mem["fits_from_world_size"] is not None:
        assert mem["peak_gib_at_fits_from"] <= gib


@pytest.mark.parametrize("name", LORA)
def test_lora_presets_fit_one_80_gb_card_at_micro_batch_two_or_more(name):
    cfg = load_config(CONFIGS / f"{name}.toml", ["model.init_from=", "data.shards=unused"])
    report = inspect(name, 80.0)
    assert report["micro_batch"] >= 2 and cfg.parallel.frozen == "replicate"
    assert report["memory"]["fits"], report["memory"]["peak_gib"]
    params = report["params"]
    frozen, trained = params["total"] - params["trainable"], params["trainable"]
    assert trained < frozen / 50  # adapters (+ DreamZero's action/state MLPs)
    assert report["memory"]["params_gib"] == pytest.approx((2 * frozen + 4 * trained) / GIB, abs=1e-5)
    assert report["memory"]["optimizer_gib"] == pytest.approx(8 * trained / GIB, abs=1e-5)


def test_a_full_fine_tune_of_dreamzero_5b_does_not_fit_80_gb_where_lora_does():
    """The positive control of the LoRA terms above: the same model trained in full holds fp32
    weights and AdamW states for every parameter."""
    full = inspect("dreamzero_5b_lora", 80.0, "model.lora_rank=0")["memory"]
    lora = inspect("dreamzero_5b_lora", 80.0)["memory"]
    assert not full["fits"] and lora["fits"]
    assert full["params_gib"] + full["optimizer_gib"] > 5 * (lora["params_gib"] + lora["optimizer_gib"])


def test_lora_memory_terms():
    dz = family("dreamzero")
    cfg = build_model("dreamzero", "tiny", {"lora_rank": 3}).cfg
    assert dz.memory_terms(build_model("dreamzero", "tiny").cfg, 3, {}) == {}
    [per_block] = set(dz.memory_terms(cfg, 3, {})["lora"]["blocks"])
    from trainkit.models.dreamzero.flops import lora_tokens
    assert per_block == 3 * sum(lora_tokens(cfg).values())

    pi = family("pi05")
    cfg = build_model("pi05", "tiny", {"lora_rank": 2}).cfg
    term = pi.memory_terms(cfg, 3, {"attention": "varlen"})["lora"]
    table = pi.activations(cfg, 3)
    assert [full + t for (full, _), t in zip(table.blocks["vision_blocks"], term["vision_blocks"])] == [0, 0]
    kept = [full + t for (full, _), t in zip(table.blocks["lm_layers"], term["lm_layers"])]
    # what stays: the action expert's half, the backbone's K and V (its attention's keys), q_proj's and
    # v_proj's rank-2 hiddens, per token
    p, a = 3 * cfg.tokens_per_image + cfg.text_len, cfg.horizon
    qd, kv, ew, mlp = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim, cfg.expert_width, cfg.expert_mlp
    assert kept == [a * (4 * ew + 2 * qd + 2 * kv + 4 * mlp) + 2 * p * kv + 2 * a * 2] * cfg.lm_depth

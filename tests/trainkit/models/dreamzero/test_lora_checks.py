"""DreamZero LoRA checkpoints and `model.lora_alpha`, refused in one line before step 0: a merged
weight that overflows (finite base, A and B; inf after alpha / r B @ A), an adapter of rank 0 (was
a ZeroDivisionError), a non-finite lora_alpha (at config load). Positive control: the same
checkpoint at a sane alpha loads."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainkit.errors import CheckpointError, ModelConfigError
from trainkit.models import build_model, family
from trainkit.models.dreamzero.weights import DZ_LORA
from trainkit.weights.load import check_weights, load_weights

FAM = family("dreamzero")


def _lora_folder(tmp_path, rank: int, b_value: float = 1.0):
    """The tiny model's tensors in peft's layout, every adapted weight with lora_A/B of `rank`."""
    src = build_model("dreamzero", "tiny", {})
    tensors = {}
    for name, p in src.state_dict().items():
        stem, _, kind = name.rpartition(".")
        if not (stem.startswith("blocks.") and stem.endswith((".q", ".k", ".v", ".o", "ffn.0", "ffn.2"))):
            tensors[DZ_LORA + name] = p
            continue
        tensors[f"{DZ_LORA}{stem}.base_layer.{kind}"] = p
        if kind == "weight":
            tensors[f"{DZ_LORA}{stem}.lora_A.default.weight"] = torch.ones(rank, p.shape[1])
            tensors[f"{DZ_LORA}{stem}.lora_B.default.weight"] = torch.full((p.shape[0], rank), b_value)
    folder = tmp_path / f"lora{rank}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_heads": src.cfg.heads}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def test_a_merged_weight_that_overflows_is_refused_at_load(tmp_path):
    folder = _lora_folder(tmp_path, 2)
    load_weights(build_model("dreamzero", "tiny", {"lora_alpha": 4.0}), FAM, folder, lambda s: None)  # control
    model = build_model("dreamzero", "tiny", {"lora_alpha": 1e308})
    with pytest.raises(CheckpointError, match=rf"^{folder}/model.safetensors: tensor 'blocks.0.* \(merged from "
                                              r".*\)' holds \d+ of \d+ values not finite"):
        load_weights(model, FAM, folder, lambda s: None)


def test_a_lora_of_rank_0_is_one_line(tmp_path):
    folder = _lora_folder(tmp_path, 0)
    with pytest.raises(CheckpointError, match=rf"^{folder}/model.safetensors: LoRA tensor '.*lora_A.*' has rank 0 "
                                              r"\(shape \[0, \d+\]\): no adapter to merge$"):
        check_weights(build_model("dreamzero", "tiny", {}), FAM, folder)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_lora_alpha_is_refused_at_config_load(alpha):
    with pytest.raises(ModelConfigError, match="lora_alpha must be a finite number"):
        build_model("dreamzero", "tiny", {"lora_alpha": alpha, "lora_rank": 2})

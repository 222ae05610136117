"""The init_from refusal "cannot tell head_dim ... set model.head_dim" also names `model.preset=tiny`
when that preset's widths are the checkpoint's (issue 35, item 7): fine-tuning a tiny export with
pi05_finetune (preset `full`) got the one field to set, not the preset that fits. Before the fix the
line ended at "set model.head_dim".
"""
from __future__ import annotations

import pytest
import torch

from trainkit.config import load_config
from trainkit.errors import CheckpointError
from trainkit.models import build_model, family
from trainkit.weights.load import write_weights
from trainkit.weights.shape import with_weights_shape


def _plain_tiny_export(folder):
    """pi05_tiny's tensors in LeRobot's layout with no trainkit metadata (as LeRobot would save it)."""
    fam = family("pi05")
    with torch.device("meta"):
        model = build_model("pi05", "tiny")
    state = {k: torch.zeros(v.shape) for k, v in model.state_dict().items()}
    folder.mkdir()
    tensors = {k: v.clone() for k, v in fam.weights.export_tensors(model.cfg, state, "lerobot").items()}
    write_weights(folder, tensors, {"type": "pi05"})
    return folder


def test_the_head_dim_refusal_names_the_preset_that_fits(tmp_path):
    folder = _plain_tiny_export(tmp_path / "ckpt")
    cfg = load_config("pi05_finetune", [f"model.init_from={folder}", "data.shards=x"], required=False)
    with pytest.raises(CheckpointError) as e:
        with_weights_shape(cfg)
    line = str(e.value)
    assert "cannot tell head_dim" in line and "set model.head_dim, or model.preset=tiny" in line, line
    assert "model.preset=tiny (or tiny_deep), whose widths" in line and "\n" not in line, line  # same widths
    cfg, fixed = with_weights_shape(load_config("pi05_finetune", [f"model.init_from={folder}", "data.shards=x",
                                                                     "model.preset=tiny"], required=False))
    assert fixed["head_dim"][0] == build_model("pi05", "tiny").cfg.head_dim  # the preset that fits loads it

"""A GR00T or DreamZero checkpoint whose config.json gives a head count no model of its widths has:
refused in one line naming the checkpoint's config.json and model.init_from (before: the family
config's own line, naming neither). Positive control: the same checkpoint unedited gives its shape."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import save_file

from trainkit.config import load_config
from trainkit.errors import CheckpointError
from trainkit.models import build_model, family
from trainkit.weights.shape import with_weights_shape

ROOT = Path(__file__).resolve().parents[3]


def _checkpoint(tmp_path: Path, name: str) -> Path:
    model = build_model(name, "tiny")
    weights = family(name).weights
    fmt = "isaac" if name == "gr00t" else "dreamzero"
    tensors = weights.export_tensors(model.cfg, model.state_dict(), fmt, *(({},) if name == "gr00t" else ()))
    folder = tmp_path / name
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(weights.config_json(model.cfg, {})))
    return folder


def _edit(folder: Path, name: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    if name == "gr00t":
        config["diffusion_model_cfg"]["num_attention_heads"] = 5  # 32 channels do not split in 5 heads
    else:
        config["num_heads"] = 3
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("name", ["gr00t", "dreamzero"])
def test_a_head_count_that_does_not_divide_the_width_names_the_file(tmp_path, name):
    folder = _checkpoint(tmp_path, name)
    cfg = load_config(ROOT / f"trainkit/configs/{name}_tiny.toml",
                      [f"model.init_from={folder}", "data.shards=/d", "output.dir=/o"])
    _, fixed = with_weights_shape(cfg)  # the intact checkpoint: its shape
    assert fixed
    _edit(folder, name)
    with pytest.raises(CheckpointError) as e:
        with_weights_shape(cfg)
    message = str(e.value)
    assert message.startswith(f"{folder / 'config.json'}: model.init_from's checkpoint gives a shape no {name} "
                              "model has: ") and "\n" not in message, message

"""GR00T's `model.init_from` takes the backbone's shapes from the checkpoint's safetensors header
(issue 35, item 5), as Pi0.5's does: config.json names the backbone ("nvidia/Cosmos-Reason2-2B"),
not its sizes, so a checkpoint at other backbone sizes was refused before
(`visual.pos_embed.weight: the model has [36, 32], the checkpoint gives [64, 32]`, then the vocabulary).

- trainkit's own export of a GR00T at non-default backbone sizes loads with `gr00t_tiny.toml` and no
  shape override: every backbone field read from the header, every tensor equal to the file's;
- a contradicting `model.*` override is refused in one line naming both values;
- what no tensor holds (the ViT's heads) is refused in one line naming the field to set;
- oracle (skipped without /tmp/lerobot-venv/.ready): LeRobot 0.6.1's own `GR00TN17`, built at tiny
  non-default backbone sizes and saved with its `save_pretrained`, trains one step from
  `gr00t_tiny.toml` with no shape override, its weights loaded equal to the file's.
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture

ROOT = Path(__file__).resolve().parents[4]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "groot_save_oracle.py"
# backbone sizes no preset has: a 64-row position table, 3 ViT blocks, ViT MLP 80, LLM 48 wide (3 x 16 heads,
# 1 KV head), MLP 112, vocabulary 320; the head follows the LLM width (VL self-attention 3 x 16)
OTHER = dict(vision_depth=3, vision_mlp=80, position_table=64, lm_width=48, lm_mlp=112, heads_q=3, heads_kv=1,
             vocab=320, vl_heads=3)


def _other_cfg():
    from trainkit.models import build_config

    return dataclasses.replace(build_config("gr00t", "tiny"), **OTHER)


def _config(folder: Path, shards: Path, *sets: str):
    from trainkit.config import load_config

    return load_config("gr00t_tiny", [f"data.shards={shards}", f"output.dir={folder.parent / 'run'}",
                                      f"model.init_from={folder}", "output.progress=false", *sets])


def _file_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _loads_equal(folder: Path, shards: Path) -> dict:
    """with_weights_shape -> build -> load_weights; every model tensor equal to the file's."""
    from trainkit.models import build_model, family
    from trainkit.models.gr00t.weights import read_plan
    from trainkit.weights.load import load_weights
    from trainkit.weights.shape import with_weights_shape

    cfg, fixed = with_weights_shape(_config(folder, shards))
    model = build_model("gr00t", cfg.model.preset, cfg.model.overrides)
    load_weights(model, family("gr00t"), str(folder), lambda _: None)
    tensors = _file_tensors(folder)
    _, rules = read_plan(model.cfg, set(tensors))
    state = model.state_dict()
    for rule in rules:
        if all(s in tensors for s in rule.sources):
            assert torch.equal(state[rule.target], rule.gather([tensors[s] for s in rule.sources])), rule.target
    return fixed


@pytest.fixture(scope="module")
def trainkit_export(tmp_path_factory) -> Path:
    from trainkit.models.gr00t.model import Gr00t
    from trainkit.models.gr00t.weights import config_json, export_tensors
    from trainkit.weights.load import write_weights

    cfg = _other_cfg()
    torch.manual_seed(0)
    model = Gr00t(cfg)
    model.init_weights()
    folder = tmp_path_factory.mktemp("gr00t_other") / "ckpt"
    folder.mkdir()
    write_weights(folder, export_tensors(cfg, model.state_dict(), "isaac"), config_json(cfg, {}))
    return folder


def test_an_export_at_other_backbone_sizes_loads_with_the_tiny_preset(trainkit_export, shards_rgb):  # noqa: F811
    fixed = _loads_equal(trainkit_export, shards_rgb)
    for name, value in OTHER.items():
        if name != "vl_heads":  # config.json's, read before
            assert fixed[name][0] == value and fixed[name][1].startswith("model.safetensors"), (name, fixed[name])
    assert fixed["head_dim"][0] == 16 and fixed["vision_heads"] == (2, "the preset's, whose vision_width is the "
                                                                       "checkpoint's")


def test_a_contradicting_override_is_refused_naming_both_values(trainkit_export, shards_rgb):  # noqa: F811
    from trainkit.errors import ConfigError
    from trainkit.weights.shape import with_weights_shape

    with pytest.raises(ConfigError) as e:
        with_weights_shape(_config(trainkit_export, shards_rgb, "model.position_table=36"))
    line = str(e.value)
    assert "model.position_table" in line and "36" in line and "64" in line and "\n" not in line, line


def test_a_vit_head_count_no_tensor_holds_is_refused_naming_the_field(tmp_path, shards_rgb):  # noqa: F811
    from trainkit.errors import CheckpointError
    from trainkit.models.gr00t.model import Gr00t
    from trainkit.models.gr00t.weights import config_json, export_tensors
    from trainkit.weights.load import write_weights
    from trainkit.weights.shape import with_weights_shape

    cfg = dataclasses.replace(_other_cfg(), vision_width=48, vision_heads=3)
    with torch.device("meta"):
        model = Gr00t(cfg)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    state = {k: torch.zeros(v.shape) for k, v in model.state_dict().items()}
    write_weights(folder, export_tensors(cfg, state, "isaac"), config_json(cfg, {}))
    with pytest.raises(CheckpointError, match="cannot tell vision_heads.*set model.vision_heads"):
        with_weights_shape(_config(folder, shards_rgb))
    cfg, fixed = with_weights_shape(_config(folder, shards_rgb, "model.vision_heads=3"))
    assert fixed["vision_width"][0] == 48 and cfg.model.overrides["vision_heads"] == 3


def _qwen(cfg) -> dict:
    """The backbone as transformers' Qwen3-VL config (as tests/trainkit/models/gr00t/test_gr00t_model_oracle.py writes it),
    one LLM layer more than select_layer (LeRobot drops the layers from select_layer on)."""
    from test_gr00t_model_oracle import qwen_config

    doc = qwen_config(cfg)
    doc["text_config"]["num_hidden_layers"] = cfg.lm_depth + 1
    return doc


@pytest.mark.timeout(600)
@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(), reason=f"no lerobot oracle venv at {LEROBOT_PY.parents[1]}")
def test_lerobots_gr00t_n17_at_tiny_other_sizes_trains_from_the_tiny_preset(tmp_path, shards_rgb):  # noqa: F811
    from trainkit.models.gr00t.weights import config_json
    from trainkit.train import run

    cfg = _other_cfg()
    folder = tmp_path / "lerobot_n17"
    doc = {"folder": str(folder), "qwen": _qwen(cfg), "config": config_json(cfg, {}), "seed": 0}
    torch.save(doc, tmp_path / "in.pt")
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(tmp_path / "in.pt")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    tensors = _file_tensors(folder)
    assert list(tensors["backbone.model.model.visual.pos_embed.weight"].shape) == [64, 32]  # LeRobot wrote it
    fixed = _loads_equal(folder, shards_rgb)
    assert fixed["position_table"][0] == 64 and fixed["vocab"][0] == 320 and fixed["lm_width"][0] == 48
    result = run(_config(folder, shards_rgb, "train.steps=1", "data.num_workers=0", "parallel.fsdp=none"))
    assert list(result.losses) == [0] and math.isfinite(result.losses[0])
    assert result.summary["init_from"]["shape"]["position_table"] == 64


def test_dreamzero_reads_its_patch_from_the_header_and_the_channels_with_it(tmp_path):
    """DreamZero's shapes came from the header already, but with the preset's patch: a (1, 1, 1) patch
    checkpoint read as 8 / 4 = 2 latent channels. A list override equal to the checkpoint's agrees."""
    from safetensors.torch import save_file

    from trainkit.models import build_model, family
    from trainkit.models.dreamzero.weights import config_from_weights
    from trainkit.weights.load import read_weights_folder

    with torch.device("meta"):
        src = build_model("dreamzero", "tiny", {"patch": (1, 1, 1)})
    fam = family("dreamzero")
    state = {k: torch.zeros(v.shape) for k, v in src.state_dict().items()}
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(fam.weights.export_tensors(src.cfg, state, "dreamzero"), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(__import__("json").dumps(fam.weights.config_json(src.cfg, {})))
    fixed = config_from_weights(read_weights_folder(folder), build_model("dreamzero", "tiny").cfg, {})
    assert fixed["patch"][0] == (1, 1, 1) and fixed["latent_channels"][0] == 8, fixed
    from trainkit.config import load_config
    from trainkit.weights.shape import with_weights_shape

    cfg, _ = with_weights_shape(load_config("dreamzero_tiny", [f"model.init_from={folder}", "model.patch=[1, 1, 1]"]))
    assert tuple(cfg.model.overrides["patch"]) == (1, 1, 1)

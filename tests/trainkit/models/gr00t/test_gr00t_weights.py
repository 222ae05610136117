"""The `gr00t` family's checkpoints (trainkit/models/gr00t/weights.py, trainkit/weights/load.py) on the
CPU at tiny widths: an export in Isaac-GR00T's layout, split into two shards with transformers'
index, loads back into a fresh model bit for bit; an export from a run that started from a
checkpoint keeps that checkpoint's other embodiments' slots; config.json decides what it states
(select_layer, VL / DiT depth, dropout, state dropout) and is refused where the tensors contradict
it; damaged folders (a shard missing, an index naming a path outside the folder) are refused in one
line naming the file. LeRobot's own load of an export is
tests/trainkit/models/gr00t/test_gr00t_model_oracle.py.
"""
import json

import pytest
import torch
from safetensors.torch import save_file

from trainkit.errors import CheckpointError, WeightsError
from trainkit.models import build_model, family
from trainkit.models.family import WeightsFiles
from trainkit.models.gr00t.chat_tokenizer import QwenChatTokenizer
from trainkit.models.gr00t.weights import config_from_weights, config_json, export_tensors, head_rules, start_keys
from trainkit.weights.load import load_weights, read_weights_folder, read_tensors

INDEX_NAME = "model.safetensors.index.json"


def tiny_model(seed: int):
    torch.manual_seed(seed)
    model = build_model("gr00t", "tiny")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def write_sharded(folder, tensors, config, index_edit=lambda m: m):
    """tensors in two shards (head / backbone) with transformers' index, and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    head = {k: v.contiguous() for k, v in tensors.items() if k.startswith("action_head.")}
    rest = {k: v.contiguous() for k, v in tensors.items() if k not in head}
    save_file(head, str(folder / "model-00001-of-00002.safetensors"))
    save_file(rest, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {**dict.fromkeys(head, "model-00001-of-00002.safetensors"),
                  **dict.fromkeys(rest, "model-00002-of-00002.safetensors")}
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": index_edit(weight_map)}))
    (folder / "config.json").write_text(json.dumps(config))


def test_sharded_isaac_export_loads_back_and_keeps_the_other_embodiments(tmp_path):
    src = tiny_model(0)
    cfg = src.cfg
    params = dict(src.named_parameters())
    base = {r.sources[0]: torch.randn(cfg.embodiments, *params[r.target].shape) for r in head_rules(cfg) if r.op == "slice"}
    tensors = {k: v.detach().to(torch.bfloat16) for k, v in export_tensors(cfg, src.state_dict(), "isaac", base).items()}
    write_sharded(tmp_path / "ckpt", tensors, config_json(cfg, {}))
    dst = tiny_model(1)
    said = []
    info = load_weights(dst, family("gr00t"), tmp_path / "ckpt", said.append)
    assert info["layout"] == "isaac" and info["unused_keys"] == 0 and info["dtypes"] == ["bfloat16"], said
    for name, p in dst.named_parameters():
        assert torch.equal(p, params[name].detach().to(torch.bfloat16).float()), name
    # an export of a run started from this checkpoint: the trained slice replaced, the others kept
    keys = set(read_weights_folder(tmp_path / "ckpt").shapes)
    kept = read_tensors(tmp_path / "ckpt", start_keys(cfg, keys))
    out = export_tensors(cfg, dst.state_dict(), "lerobot", kept)
    for key, full in kept.items():
        got = out["_groot_model." + key]
        others = [e for e in range(cfg.embodiments) if e != cfg.embodiment]
        assert torch.equal(got[others], full[others].to(got.dtype)), key
    rule = next(r for r in head_rules(cfg) if r.op == "slice")
    assert torch.equal(out["_groot_model." + rule.sources[0]][cfg.embodiment], dict(dst.named_parameters())[rule.target])


def test_config_json_decides_what_it_states_and_the_tensors_hold_it_to_it(tmp_path):
    cfg = build_model("gr00t", "tiny").cfg
    with torch.device("meta"):
        state = build_model("gr00t", "tiny").state_dict()
    shapes = {k: tuple(v.shape) for k, v in export_tensors(cfg, state, "isaac").items()}
    doc = config_json(cfg, {})
    doc["state_dropout_prob"] = 0.1
    doc["diffusion_model_cfg"]["dropout"] = 0.05
    files = WeightsFiles(shapes=shapes, config=doc, metadata={}, folder=str(tmp_path))
    fixed = config_from_weights(files, cfg, {})
    assert fixed["state_dropout"][0] == 0.1 and fixed["dropout"][0] == 0.05
    assert "tokenizer" not in fixed  # the folder holds no tokenizer.json
    QwenChatTokenizer.builtin(tokens_per_image=4).tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert config_from_weights(files, cfg, {})["tokenizer"][0] == str(tmp_path)  # the batches use its tokenizer
    assert "tokenizer" not in config_from_weights(files, cfg, {"tokenizer": "elsewhere"})  # the run's own
    assert (fixed["lm_depth"][0], fixed["vl_layers"][0], fixed["dit_depth"][0]) == (4, 2, 4)
    assert fixed["lm_depth"][1] == "config.json select_layer" and "lm_trained" not in fixed
    doc["diffusion_model_cfg"]["num_layers"] = 6
    with pytest.raises(WeightsError, match=r"diffusion_model_cfg\.num_layers is 6, but the checkpoint holds 4 blocks"):
        config_from_weights(files, cfg, {})
    doc["diffusion_model_cfg"]["num_layers"] = 4
    doc["max_action_dim"] = 32
    with pytest.raises(WeightsError, match=r"max_action_dim is 32, but tensor 'action_head\.action_encoder\.W1\.W'"):
        config_from_weights(files, cfg, {})


@pytest.mark.parametrize("damage,says", [
    ("missing shard", "names shard 'model-00002-of-00002.safetensors', which the folder lacks"),
    ("outside", "names shard '../model-00001-of-00002.safetensors', which the folder lacks"),
])
def test_damaged_sharded_checkpoints_are_refused_in_one_line(tmp_path, damage, says):
    model = tiny_model(0)
    tensors = {k: v.detach() for k, v in export_tensors(model.cfg, model.state_dict(), "isaac").items()}
    edit = {"outside": lambda m: {**m, next(iter(m)): "../model-00001-of-00002.safetensors"}}.get(damage, lambda m: m)
    write_sharded(tmp_path / "ckpt", tensors, config_json(model.cfg, {}), edit)
    if damage == "missing shard":
        (tmp_path / "ckpt" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=says) as e:
        read_weights_folder(tmp_path / "ckpt")
    assert "\n" not in str(e.value)

"""GR00T N1.7's backbone and processor pieces without the LeRobot oracle (that comparison is
tests/trainkit/models/gr00t/test_gr00t_backbone_oracle.py): mRoPE positions against a direct per-sample walk of
transformers' `get_rope_index` rules, the full-size shapes against Cosmos-Reason2-2B's published
parameter count, padding invariance of the features, the chat tokenizer's layout and its refusals,
and the loader's N1.7 view settings.
"""
from __future__ import annotations

import json

import pytest
import torch

from datakit.loader.config import LoaderConfig
from datakit.loader.resize import resize_view
from trainkit.errors import ModelConfigError, TokenizerError
from trainkit.models.gr00t.batches import n17_view_settings
from trainkit.models.gr00t.chat_tokenizer import QwenChatTokenizer
from trainkit.models.gr00t.qwen3_vl.mrope import mrope_positions
from trainkit.models.gr00t.qwen3_vl.backbone import Qwen3VLBackbone
from trainkit.models.gr00t.qwen3_vl.config import Qwen3VLConfig, cosmos_reason2_2b, from_hf_config

IMG = 9


def walk_positions(ids: list[int], valid: list[bool], grid: tuple[int, int]) -> list[list[int]]:
    """get_rope_index's rules, one token at a time: text +1 on every axis; an image run of gh x gw
    tokens at p: (p, p + row, p + col), then the text resumes at p + max(gh, gw); padding 0."""
    gh, gw = grid
    out, pos, i = [[0, 0, 0] for _ in ids], 0, 0
    while i < len(ids):
        if not valid[i]:
            i += 1
        elif ids[i] == IMG:
            for j in range(gh * gw):
                out[i + j] = [pos, pos + j // gw, pos + j % gw]
            pos, i = pos + max(gh, gw), i + gh * gw
        else:
            out[i], pos, i = [pos, pos, pos], pos + 1, i + 1
    return out


def test_mrope_positions_follow_get_rope_index():
    grid = (2, 3)
    rows = [[1, 2, IMG, *[IMG] * 5, 3, 4, 5], [1, *[IMG] * 6, 2, *[IMG] * 6, 3], [7, 8, 1, *[IMG] * 6, 2]]
    t = max(map(len, rows)) + 2
    ids, valid = [], []
    for k, r in enumerate(rows):  # left, right and no padding
        pad = t - len(r)
        left = pad if k != 1 else 0
        ids.append([0] * left + r + [0] * (pad - left))
        valid.append([False] * left + [True] * len(r) + [False] * (pad - left))
    got = mrope_positions(torch.tensor(ids), torch.tensor(valid), IMG, grid)
    want = torch.tensor([walk_positions(i, v, grid) for i, v in zip(ids, valid)]).permute(2, 0, 1)
    assert torch.equal(got, want)


def test_full_size_shapes_match_cosmos_reason2_2b():
    """All 28 layers, plus the final norm and the LM head (counted untied), give the model card's
    2,438,696,960 parameters; N1.7's backbone keeps 16 of the layers."""
    cfg = Qwen3VLConfig(select_layer=28)
    with torch.device("meta"):
        full = sum(p.numel() for p in Qwen3VLBackbone(cfg).parameters())
    assert full + cfg.hidden + cfg.vocab * cfg.hidden == 2_438_696_960
    assert cosmos_reason2_2b().tokens_per_image == 64


def tiny() -> Qwen3VLConfig:
    return Qwen3VLConfig(hidden=32, select_layer=4, mlp=48, heads_q=4, heads_kv=2, head_dim=8, mrope_section=(2, 1, 1),
                         rope_theta=100.0, vocab=16, image_token_id=IMG, vision_width=16, vision_depth=3, vision_mlp=32,
                         vision_heads=2, patch=2, position_table=16, deepstack=(0, 1, 2), image_size=(4, 8))


def test_features_do_not_depend_on_padding():
    torch.manual_seed(0)
    cfg = tiny()
    model = Qwen3VLBackbone(cfg).eval()
    n = cfg.tokens_per_image
    ids = torch.tensor([[1, 2, *[IMG] * n, 3, *[IMG] * n, 4, 5]])
    images = torch.randn(2, 3, *cfg.image_size)
    with torch.no_grad():
        plain = model(ids, torch.ones_like(ids, dtype=torch.bool), images).features
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
        mask = padded != 0
        out = model(padded, mask, images)
    assert torch.isfinite(out.features).all()
    torch.testing.assert_close(out.features[:, 3:], plain, rtol=1e-5, atol=1e-5)
    assert out.image_mask.sum() == 2 * n and torch.equal(out.attention_mask, mask)
    with pytest.raises(ModelConfigError, match="image_size"):
        model(ids, torch.ones_like(ids, dtype=torch.bool), torch.randn(2, 3, 8, 8))


# Cosmos-Reason2-2B's config.json (transformers 4.x layout), the keys from_hf_config reads, as LeRobot
# 0.6.1 hard-codes them in groot_n1_7.py::_cosmos_reason2_qwen3_vl_config
COSMOS_CONFIG_JSON = {
    "image_token_id": 151655,
    "text_config": {"head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
                    "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "rope_theta": 5000000,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                    "vocab_size": 151936},
    "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_size": 1024,
                      "intermediate_size": 4096, "num_heads": 16, "num_position_embeddings": 2304,
                      "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


def test_cosmos_preset_is_its_config_json():
    assert from_hf_config(COSMOS_CONFIG_JSON, select_layer=16) == cosmos_reason2_2b()
    with pytest.raises(ModelConfigError, match="select_layer 29 exceeds"):
        from_hf_config(COSMOS_CONFIG_JSON, select_layer=29)


def test_bad_backbone_configs_are_refused():
    with pytest.raises(ModelConfigError, match="mrope_section"):
        Qwen3VLConfig(mrope_section=(24, 20, 21))
    with pytest.raises(ModelConfigError, match="not a Qwen3-VL config.json"):
        from_hf_config({"text_config": {}}, select_layer=16)


def test_builtin_tokenizer_layout():
    tok = QwenChatTokenizer.builtin(tokens_per_image=3)
    ids, mask = tok.encode(["Pick the Cube!", ""], views=2)
    text = tok.tokenizer.decode(ids[0][mask[0]].tolist(), skip_special_tokens=False)
    pads = "<|image_pad|>" * 3
    assert text == f"<|im_start|>user\n<|vision_start|>{pads}<|vision_end|><|vision_start|>{pads}<|vision_end|>" \
                   "pick the cube<|im_end|>\n"
    assert (ids[1][mask[1]] == tok.image_token_id).sum() == 6 and not mask[0, 0] and mask[1].all()  # left padding
    assert "perform the task" in tok.tokenizer.decode(ids[1].tolist())
    with pytest.raises(TokenizerError, match="exceeds the fixed length 10"):
        tok.encode(["x"], views=2, length=10)


def test_tokenizer_folder_problems_are_named(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        QwenChatTokenizer.from_folder(tmp_path, tokens_per_image=4)
    QwenChatTokenizer.builtin(tokens_per_image=4).tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    with pytest.raises(TokenizerError, match="no chat template"):
        QwenChatTokenizer.from_folder(tmp_path, tokens_per_image=4)
    run = "<|vision_start|><|image_pad|><|vision_end|>"
    (tmp_path / "chat_template.json").write_text(json.dumps(
        {"chat_template": f"{{{{ messages[0].role }}}}!{run}{{{{ messages[0].content[-1].text }}}}"}))
    assert QwenChatTokenizer.from_folder(tmp_path, tokens_per_image=4).prompt("x", 1) == \
        f"user!<|vision_start|>{'<|image_pad|>' * 4}<|vision_end|>x"
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].role }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    assert QwenChatTokenizer.from_folder(tmp_path, tokens_per_image=4).pad_id == 256  # Qwen2Tokenizer's default
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<pad>"}))
    with pytest.raises(TokenizerError, match="has no '<pad>' token"):
        QwenChatTokenizer.from_folder(tmp_path, tokens_per_image=4)


def test_n17_view_settings():
    cfg = LoaderConfig(**n17_view_settings((256, 256)))
    assert (cfg.resize, cfg.crop, cfg.crop_resize, cfg.resize_mode) == ((256, 256), (230, 230), True, "bicubic")
    assert not cfg.random_crop and LoaderConfig(**n17_view_settings((256, 256), random_crop=True)).crop_per_sample
    with pytest.raises(ValueError, match="crop_resize"):
        LoaderConfig(resize=(256, 256), crop_resize=True)
    x = torch.randint(0, 256, (1, 3, 5, 7), dtype=torch.uint8)
    y = resize_view(x, (8, 8), "bicubic")
    assert torch.equal(y, y.round()) and y.min() >= 0 and y.max() <= 255

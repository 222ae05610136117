"""trainkit's GR00T N1.7 backbone (Qwen3-VL) and processor against LeRobot 0.6.1's, at tiny sizes on the CPU.

The oracle (tools/lerobot_oracle/groot_backbone_oracle.py, in its own venv: `make lerobot-oracle`;
skipped without it) patches LeRobot's hard-coded Cosmos-Reason2-2B config to tiny widths, builds
`GR00TN17(cfg, load_backbone_weights=False)` with every backbone tensor random, and runs its
backbone on a batch laid out as N1.7's processor lays it out (chat text with image pads inline,
left padding and one sample padded on the right, a non-square grid, samples with different
numbers of views and text lengths).
trainkit builds its backbone from the oracle's config.json (`from_hf_config`), loads the oracle's
tensors by `backbone_key` (every built tensor loaded, none left over but the final norm and the
tied LM head) and must give the same features, at every position (padding too: N1.7's head
attends to them without a mask), to float32 precision. Two broken backbones must fail the same
comparison: a wrong mRoPE section and deepstack off.

Processor: the same oracle run encodes camera frames and prompts with LeRobot's N1.7 encode step
(`GrootN17VLMEncodeStep`, the pack step's language formatting first), its Qwen3-VL processor
built from a tokenizer folder this test writes (a byte-level BPE with a few merges and Qwen's
normaliser and split pattern, loaded by LeRobot as a `Qwen2Tokenizer`; a chat template of
Qwen3-VL's structure; a tiny preprocessor config; nothing downloaded). trainkit's `QwenChatTokenizer.from_folder` must give the same input_ids and
attention mask, and datakit's normaliser with the family's view settings (`n17_view_settings`:
bicubic 32 x 32, centre crop 28, back to 32 x 32) the
same pixel values, to float32 rounding against torchvision's float kernel (its GPU path), and
within half a level on average of its CPU fixed-point uint8 kernel.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from datakit.loader.config import LoaderConfig
from datakit.loader.normalise import Normaliser
from trainkit.models.gr00t.batches import n17_view_settings
from trainkit.models.gr00t.chat_tokenizer import QwenChatTokenizer
from trainkit.models.gr00t.qwen3_vl.backbone import BACKBONE_PREFIX, Qwen3VLBackbone, backbone_key
from trainkit.models.gr00t.qwen3_vl.config import from_hf_config

ROOT = Path(__file__).resolve().parents[4]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "groot_backbone_oracle.py"
REL = 3e-6  # float32: the features' max error relative to their max magnitude (1.0e-6 measured)

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                 reason=f"no lerobot venv at {LEROBOT_PY.parents[1]} (make lerobot-oracle)")]

IMAGE, START, END, IM_START, IM_END = 290, 291, 292, 293, 294  # tiny vocab's special ids
IMAGE_HW, PATCH, MERGE, TP = (16, 24), 4, 2, 2
TINY_QWEN = {
    "image_token_id": IMAGE, "video_token_id": 295, "vision_start_token_id": START, "vision_end_token_id": END,
    "tie_word_embeddings": True,
    "text_config": {"attention_bias": False, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
                    "intermediate_size": 96, "max_position_embeddings": 4096, "num_attention_heads": 4,
                    "num_hidden_layers": 6, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [3, 3, 2], "rope_type": "default"},
                    "rope_theta": 100, "vocab_size": 300},  # theta 100: every frequency turns over a few positions
    "vision_config": {"deepstack_visual_indexes": [0, 2, 3], "depth": 4, "hidden_act": "gelu_pytorch_tanh",
                      "hidden_size": 32, "in_channels": 3, "intermediate_size": 64, "num_heads": 2,
                      "num_position_embeddings": 36, "out_hidden_size": 64, "patch_size": PATCH,
                      "spatial_merge_size": MERGE, "temporal_patch_size": TP},
}
SELECT_LAYER = 4
VIEW, CROP, FRAME = 32, 28, (40, 60)  # processor: target view, centre crop, stored camera frame (H, W)
PROC_TOKENS = (VIEW // PATCH // MERGE) ** 2
# Qwen3-VL's chat template structure (system turn, image / video counters, vision ids, string or
# list content), written for this test: the real one ships with the backbone's tokenizer files
QWEN3_VL_LIKE_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}"
    "{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}"
    "{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'video' or 'video' in content %}"
    "{%- set video_count.value = video_count.value + 1 %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LANGUAGE = ["Pick up the RED cube, then place it!", "", "stack_blocks in the café's 2nd tray"]


def hf_pixel_values(images: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) views -> transformers' Qwen3-VL `pixel_values` (N x patches, 3 x TP x P x P): each
    view repeated TP times, patches in 2x2-block order (the image processor's layout)."""
    n, c, h, w = images.shape
    gh, gw = h // PATCH, w // PATCH
    x = images[:, None].expand(n, TP, c, h, w).reshape(n, 1, TP, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    return x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9).reshape(n * gh * gw, c * TP * PATCH * PATCH)


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(input_ids, attention_mask, images, views per sample): N1.7's layout, padded."""
    gen = torch.Generator().manual_seed(1)
    per_image = (IMAGE_HW[0] // PATCH // MERGE) * (IMAGE_HW[1] // PATCH // MERGE)
    views, text_lens = [2, 2, 1], [5, 2, 7]
    rows = []
    for v, n in zip(views, text_lens):
        ids = [IM_START, 7, 8]
        for _ in range(v):
            ids += [START] + [IMAGE] * per_image + [END]
        ids += torch.randint(10, 280, (n,), generator=gen).tolist() + [IM_END, 8]
        rows.append(ids)
    t = max(map(len, rows))
    # left padding as LeRobot's processor pads, and sample 1 padded on the right
    input_ids = torch.tensor([r + [0] * (t - len(r)) if k == 1 else [0] * (t - len(r)) + r for k, r in enumerate(rows)])
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) if k == 1 else [0] * (t - len(r)) + [1] * len(r)
                         for k, r in enumerate(rows)])
    images = torch.rand(sum(views), 3, *IMAGE_HW, generator=gen) * 2 - 1
    return input_ids, mask, images, views


QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
MERGES = [("p", "i"), ("pi", "c"), ("pic", "k"), ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("u", "s"), ("e", "r"),
          ("us", "er"), ("Ġ", "c")]


def tokenizer_folder(folder: Path) -> Path:
    """Tokenizer files of a Qwen3-VL checkpoint at tiny sizes: a byte-level BPE with a few merges and
    Qwen's pipeline (NFC, its split pattern, byte level), read by LeRobot as a `Qwen2Tokenizer`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from trainkit.models.gr00t.chat_tokenizer import SPECIAL

    folder.mkdir()
    byte_vocab = QwenChatTokenizer.builtin(tokens_per_image=PROC_TOKENS).tokenizer.get_vocab()
    vocab = {k: v for k, v in byte_vocab.items() if k not in SPECIAL}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([*SPECIAL, "<|video_pad|>"])  # the processor counts video pads too
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "chat_template": QWEN3_VL_LIKE_TEMPLATE}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor", "patch_size": PATCH,
        "temporal_patch_size": TP, "merge_size": MERGE, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "size": {"shortest_edge": 256, "longest_edge": 1 << 24}}))
    return folder


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    root = tmp_path_factory.mktemp("gr00t_backbone_oracle")
    input_ids, mask, images, views = batch()
    grid = torch.tensor([[1, IMAGE_HW[0] // PATCH, IMAGE_HW[1] // PATCH]] * images.shape[0])
    video = torch.randint(0, 256, (len(LANGUAGE), 1, 2, *FRAME, 3), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(5))
    doc = {"backbone": {"qwen": TINY_QWEN, "select_layer": SELECT_LAYER, "seed": 3, "input_ids": input_ids,
                        "attention_mask": mask, "pixel_values": hf_pixel_values(images), "image_grid_thw": grid},
           "processor": {"folder": str(tokenizer_folder(root / "tokenizer")), "video": video, "language": LANGUAGE,
                         "crop_size": [CROP, CROP], "target_size": [VIEW, VIEW]}}
    torch.save(doc, root / "in.pt")
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(root / "in.pt"), str(root / "out.pt")],
                          capture_output=True, text=True, timeout=170, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(root / "out.pt", weights_only=False), (input_ids, mask, images), (root / "tokenizer", video)


def load(out: dict, **overrides) -> Qwen3VLBackbone:
    cfg = dataclasses.replace(from_hf_config(out["config"], select_layer=SELECT_LAYER, image_size=IMAGE_HW), **overrides)
    model = Qwen3VLBackbone(cfg)
    mapped = {backbone_key(k, cfg): v for k, v in out["state"].items()}
    left = sorted(k for k in out["state"] if backbone_key(k, cfg) is None)
    assert left == ["backbone.model.lm_head.weight", f"{BACKBONE_PREFIX}language_model.norm.weight"]  # not built
    mapped.pop(None)
    model.load_state_dict(mapped, strict=True)
    return model.eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def features(model: Qwen3VLBackbone, inputs) -> torch.Tensor:
    input_ids, mask, images = inputs
    with torch.no_grad():
        return model(input_ids, mask.bool(), images)


def test_backbone_features_equal_lerobot(oracle):
    out, inputs, _ = oracle
    ref = out["backbone"]
    got = features(load(ref), inputs)
    assert got.features.shape == ref["features"].shape
    assert torch.equal(got.image_mask, ref["image_mask"]) and torch.equal(got.attention_mask, ref["attention_mask"])
    assert rel(got.features, ref["features"]) < REL


def test_wrong_mrope_section_and_no_deepstack_fail(oracle):
    out, inputs, _ = oracle
    ref = out["backbone"]
    wrong_section = load(ref, mrope_section=(4, 2, 2))
    assert rel(features(wrong_section, inputs).features, ref["features"]) > 100 * REL
    no_deepstack = load(ref)
    with torch.no_grad():
        for merger in no_deepstack.visual.deepstack_merger_list:
            merger.linear_fc2.weight.zero_()
            merger.linear_fc2.bias.zero_()
    assert rel(features(no_deepstack, inputs).features, ref["features"]) > 100 * REL


def test_processor_tokens_and_pixels_equal_lerobot(oracle):
    out, _, (folder, video) = oracle
    ref = out["processor"]
    b, _, v = video.shape[:3]
    tokenizer = QwenChatTokenizer.from_folder(folder, tokens_per_image=PROC_TOKENS)
    input_ids, attention_mask = tokenizer.encode(LANGUAGE, views=v)
    for kernel in ("float", "native"):
        assert torch.equal(input_ids, ref[kernel]["input_ids"])
        assert torch.equal(attention_mask, ref[kernel]["attention_mask"].bool())
    assert torch.equal(ref["float"]["image_grid_thw"], torch.tensor([[1, VIEW // PATCH, VIEW // PATCH]] * (b * v)))

    cfg = LoaderConfig(**n17_view_settings((VIEW, VIEW), crop_fraction=CROP / VIEW), image_dtype="float32")
    std, mean = torch.tensor(cfg.image_std), torch.tensor(cfg.image_mean)
    norm = Normaliser(cfg=cfg, layout="rgb", image_scale=1.0 / (255.0 * std), image_bias=-mean / std,
                      state_affine=(torch.ones(1), torch.zeros(1)), action_affine=(torch.ones(1), torch.zeros(1)))
    # datakit's batch layout (B, K slots, T frames, H, W, C); LeRobot's video is (B, T, V, H, W, C)
    views = norm.images(video.permute(0, 2, 1, 3, 4, 5).contiguous())[:, :, -1]  # (B, V, 3, H, W)
    pixels = hf_pixel_values(views.flatten(0, 1))
    level = 2.0 / 255.0  # one uint8 level in the normalised range [-1, 1]
    assert (pixels - ref["float"]["pixel_values"]).abs().max() < 1e-6
    # torchvision's CPU fixed-point kernel is another rounding of the same filter: on these noise frames
    # (its worst case) it differs by 0.35 levels on average, by more than one level at 0.8% of values
    assert ((pixels - ref["native"]["pixel_values"]).abs() / level).mean() < 0.5
    # the crop matters: without it the same frames give other pixels
    uncropped = Normaliser(cfg=LoaderConfig(**n17_view_settings((VIEW, VIEW), crop_fraction=1.0),
                                            image_dtype="float32"),
                           layout="rgb", image_scale=norm.image_scale, image_bias=norm.image_bias,
                           state_affine=norm.state_affine, action_affine=norm.action_affine)
    plain = hf_pixel_values(uncropped.images(video.permute(0, 2, 1, 3, 4, 5).contiguous())[:, :, -1].flatten(0, 1))
    assert (plain - ref["float"]["pixel_values"]).abs().max() > 10 * level

"""trainkit's GR00T N1.7 backbone (Qwen3-VL) against LeRobot 0.6.1's, at tiny sizes on the CPU.

The oracle (tools/lerobot_oracle/groot_backbone_oracle.py, in its own venv: `make lerobot-oracle`;
skipped without it) patches LeRobot's hard-coded Cosmos-Reason2-2B config to tiny widths, builds
`GR00TN17(cfg, load_backbone_weights=False)` with every backbone tensor random, and runs its
backbone on a batch laid out as N1.7's processor lays it out (chat text with image pads inline,
left padding, a non-square grid, samples with different numbers of views and text lengths).
trainkit builds its backbone from the oracle's config.json (`from_hf_config`), loads the oracle's
tensors by `backbone_key` (every built tensor loaded, none left over but the final norm and the
tied LM head) and must give the same features, at every position (padding too: N1.7's head
attends to them without a mask), to float32 precision. Two broken backbones must fail the same
comparison: a wrong mRoPE section and deepstack off.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
import torch

from trainkit.models.gr00t.qwen3_vl import BACKBONE_PREFIX, Qwen3VLBackbone, backbone_key
from trainkit.models.gr00t.qwen3_vl_config import from_hf_config

ROOT = Path(__file__).resolve().parents[1]
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


def hf_pixel_values(images: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) views -> transformers' Qwen3-VL `pixel_values` (N x patches, 3 x TP x P x P): each
    view repeated TP times, patches in 2x2-block order (the image processor's layout)."""
    n, c, h, w = images.shape
    gh, gw = h // PATCH, w // PATCH
    x = images[:, None].expand(n, TP, c, h, w).reshape(n, 1, TP, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    return x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9).reshape(n * gh * gw, c * TP * PATCH * PATCH)


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(input_ids, attention_mask, images, views per sample): N1.7's layout, left-padded."""
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
    input_ids = torch.tensor([[0] * (t - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (t - len(r)) + [1] * len(r) for r in rows])
    images = torch.rand(sum(views), 3, *IMAGE_HW, generator=gen) * 2 - 1
    return input_ids, mask, images, views


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    root = tmp_path_factory.mktemp("gr00t_backbone_oracle")
    input_ids, mask, images, views = batch()
    grid = torch.tensor([[1, IMAGE_HW[0] // PATCH, IMAGE_HW[1] // PATCH]] * images.shape[0])
    doc = {"backbone": {"qwen": TINY_QWEN, "select_layer": SELECT_LAYER, "seed": 3, "input_ids": input_ids,
                        "attention_mask": mask, "pixel_values": hf_pixel_values(images), "image_grid_thw": grid}}
    torch.save(doc, root / "in.pt")
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(root / "in.pt"), str(root / "out.pt")],
                          capture_output=True, text=True, timeout=170, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(root / "out.pt", weights_only=False), (input_ids, mask, images)


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
    out, inputs = oracle
    ref = out["backbone"]
    got = features(load(ref), inputs)
    assert got.features.shape == ref["features"].shape
    assert torch.equal(got.image_mask, ref["image_mask"]) and torch.equal(got.attention_mask, ref["attention_mask"])
    assert rel(got.features, ref["features"]) < REL


def test_wrong_mrope_section_and_no_deepstack_fail(oracle):
    out, inputs = oracle
    ref = out["backbone"]
    wrong_section = load(ref, mrope_section=(4, 2, 2))
    assert rel(features(wrong_section, inputs).features, ref["features"]) > 100 * REL
    no_deepstack = load(ref)
    with torch.no_grad():
        for merger in no_deepstack.visual.deepstack_merger_list:
            merger.linear_fc2.weight.zero_()
            merger.linear_fc2.bias.zero_()
    assert rel(features(no_deepstack, inputs).features, ref["features"]) > 100 * REL

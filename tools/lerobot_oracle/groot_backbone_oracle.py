"""Runs LeRobot 0.6.1's GR00T N1.7 backbone (`Qwen3Backbone`: transformers' Qwen3-VL) and its
processor step (`GrootN17VLMEncodeStep`: N1.7's image transform, the Qwen3-VL chat template and
tokenizer) at tiny sizes on the CPU, nothing downloaded, as the oracle of trainkit's
`gr00t` backbone and processor. Never imported by trainkit: tests/trainkit/models/gr00t/test_gr00t_backbone_oracle.py
calls it through the oracle venv's interpreter.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/groot_backbone_oracle.py IN.pt OUT.pt

IN.pt (torch.save) has either part or both:
- "backbone": {"qwen": Qwen3VLConfig kwargs (tiny), "select_layer", "seed", "input_ids",
  "attention_mask", "pixel_values" (transformers' patch layout), "image_grid_thw"}. LeRobot's
  hard-coded Cosmos-Reason2-2B config (`_cosmos_reason2_qwen3_vl_config`) is patched to the tiny
  one, `GR00TN17(cfg, load_backbone_weights=False)` is built, every backbone parameter is set
  to seeded random values (norm scales around 1), and its backbone runs. OUT["backbone"]:
  "state" (the backbone's tensors under GR00TN17's names, `backbone.model.model.*`), "config"
  (the Qwen3-VL config.json as a dict), "features", "image_mask", "attention_mask".
- "processor": {"folder" (tokenizer.json, tokenizer_config.json with the chat template,
  preprocessor_config.json), "video" (B, T, V, H, W, C) uint8, "language" [str], "crop_size",
  "target_size"}. The language is formatted as the pack step does (`formalize_language`) and
  `GrootN17VLMEncodeStep` encodes the batch with the processor built from the folder
  (`_build_n1_7_processor` is pointed at it). OUT["processor"]: {"native", "float"}: the encoded
  tensors (input_ids, attention_mask, pixel_values, image_grid_thw) with torchvision's CPU
  fixed-point kernel for the bicubic resize of uint8 frames, and with its float kernel, clamped
  and rounded (the path it takes on the GPU).

Setup: make lerobot-oracle
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def backbone(doc: dict) -> dict:
    from transformers import Qwen3VLConfig
    from transformers.feature_extraction_utils import BatchFeature

    import lerobot.policies.groot.groot_n1_7 as n17

    n17._cosmos_reason2_qwen3_vl_config = lambda: Qwen3VLConfig(**doc["qwen"])
    head = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8}
    cfg = n17.GR00TN17Config(select_layer=doc["select_layer"], backbone_embedding_dim=doc["qwen"]["text_config"]["hidden_size"],
                             hidden_size=16, input_embedding_dim=16, max_num_embodiments=1, max_state_dim=4,
                             max_action_dim=4, action_horizon=2,
                             diffusion_model_cfg={**n17.GR00T_N1_7_DEFAULTS["diffusion_model_cfg"], **head, "output_dim": 16},
                             vl_self_attention_cfg={**n17.GR00T_N1_7_DEFAULTS["vl_self_attention_cfg"], **head})
    model = n17.GR00TN17(cfg, load_backbone_weights=False).eval()
    gen = torch.Generator().manual_seed(doc["seed"])
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name and name.endswith("weight") else 0.2 * noise)
    x = {k: doc[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")}
    with torch.no_grad():
        out = model.backbone(BatchFeature(data=x))
    state = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("backbone.")}
    return {"state": state, "config": model.backbone.model.config.to_dict(),
            "features": out["backbone_features"], "image_mask": out["image_mask"],
            "attention_mask": out["backbone_attention_mask"]}


def processor(doc: dict) -> dict:
    from torchvision.transforms.v2.functional import _geometry

    import lerobot.policies.groot.processor_groot as pg
    from lerobot.lerobot_types import TransitionKey
    from lerobot.policies.groot.utils import prepare_n1_7_language_batch

    build = pg._build_n1_7_processor
    pg._build_n1_7_processor = lambda model_name=None: build(doc["folder"])
    step = pg.GrootN17VLMEncodeStep(model_name=doc["folder"], image_crop_size=list(doc["crop_size"]),
                                    image_target_size=list(doc["target_size"]))
    video = doc["video"].numpy()
    # the pack step's language formatting (formalize_language, N1.7's default), then the encode step
    language = prepare_n1_7_language_batch(doc["language"], video.shape[0], formalize_language=True)
    out = {}
    native = _geometry._do_native_uint8_resize_on_cpu
    for name, uint8_kernel in (("native", native), ("float", lambda interpolation: False)):
        _geometry._do_native_uint8_resize_on_cpu = uint8_kernel
        transition = {TransitionKey.OBSERVATION: {"video": video},
                      TransitionKey.COMPLEMENTARY_DATA: {"language": list(language)}}
        comp = step(transition)[TransitionKey.COMPLEMENTARY_DATA]
        out[name] = {k: comp[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")}
    return out


def main(argv: list[str]) -> int:
    doc = torch.load(argv[1], weights_only=False)
    torch.set_default_dtype(torch.float32)
    out = {}
    if "backbone" in doc:
        out["backbone"] = backbone(doc["backbone"])
    if "processor" in doc:
        out["processor"] = processor(doc["processor"])
    torch.save(out, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

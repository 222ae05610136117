"""LeRobot 0.6.1 serving a `trainkit export --format lerobot` of a `gr00t` run, as a LeRobot user
would (run in the lerobot venv; tests/trainkit/models/gr00t/test_gr00t_serve_oracle.py drives it).

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/groot_serve_oracle.py IN.pt OUT.pt

IN.pt (torch.save): {"export": the folder, "qwen": the tiny Qwen3-VL config (LeRobot's hard-coded
Cosmos-Reason2-2B config, `_cosmos_reason2_qwen3_vl_config`, is patched to it, as
groot_model_oracle.py does), "images": {camera: uint8 (H, W, 3) as a robot gives it}, "state":
float32 (D,), "task": str, "noise": (1, horizon, action_dim) float32, optional "kernel": "float" (the
bicubic resizes of N1.7's view transform run with torchvision's float kernel, clamped and rounded:
its GPU path; default "native": its CPU fixed-point uint8 kernel), optional "control": another
export folder whose preprocessor alone runs on the same observation}. From the folder alone:
`PreTrainedConfig.from_pretrained`, `GrootPolicy.from_pretrained` (strict), `make_pre_post_processors(cfg,
pretrained_path=EXPORT)`; the raw observation through `prepare_observation_for_inference`, the
preprocessor, `policy.select_action` n_action_steps times (one chunk, then its queue) and the
postprocessor on each action. The flow noise is IN's: `torch.randn` returns it during
`select_action` (the sampler's one draw). OUT.pt: "actions" (1, n_action_steps, A), and what the
preprocessor made: "input_ids", "attention_mask", "pixel_values", "state", "embodiment_id"; and
"pixel_values_native" (the preprocessor again with the CPU kernel), "control_pixel_values" (the
control folder's preprocessor, when IN names one).

Setup: make lerobot-oracle
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def run(doc: dict) -> dict:
    from transformers import Qwen3VLConfig

    import lerobot.policies.groot.groot_n1_7 as n17

    n17._cosmos_reason2_qwen3_vl_config = lambda: Qwen3VLConfig(**doc["qwen"])
    n17._register_with_transformers()
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.groot.modeling_groot import GrootPolicy
    from lerobot.policies.utils import prepare_observation_for_inference
    from torchvision.transforms.v2.functional import _geometry

    export = doc["export"]
    cfg = PreTrainedConfig.from_pretrained(export)
    policy = GrootPolicy.from_pretrained(export, config=cfg)
    raw = {cam: frame.numpy() for cam, frame in doc["images"].items()}
    raw["observation.state"] = doc["state"].numpy()

    def preprocess(folder: str, kernel: str) -> dict:
        pre, _ = make_pre_post_processors(PreTrainedConfig.from_pretrained(folder), pretrained_path=folder)
        native = _geometry._do_native_uint8_resize_on_cpu
        if kernel == "float":
            _geometry._do_native_uint8_resize_on_cpu = lambda interpolation: False
        try:
            return pre(prepare_observation_for_inference(dict(raw), torch.device("cpu"), task=doc["task"]))
        finally:
            _geometry._do_native_uint8_resize_on_cpu = native

    _, post = make_pre_post_processors(cfg, pretrained_path=export)
    batch = preprocess(export, doc.get("kernel", "native"))
    extra = {"pixel_values_native": preprocess(export, "native")["pixel_values"]}
    if doc.get("control"):
        extra["control_pixel_values"] = preprocess(doc["control"], doc.get("kernel", "native"))["pixel_values"]
    policy.reset()
    randn = torch.randn
    torch.randn = lambda *a, **k: doc["noise"].clone()
    try:
        with torch.no_grad():
            actions = [post(policy.select_action(batch)) for _ in range(cfg.n_action_steps)]
    finally:
        torch.randn = randn
    return {"actions": torch.stack(actions, dim=1), **extra, **{k: batch[k] for k in (
        "input_ids", "attention_mask", "pixel_values", "state", "embodiment_id")}}


if __name__ == "__main__":
    torch.set_default_dtype(torch.float32)
    torch.save(run(torch.load(sys.argv[1], weights_only=False)), sys.argv[2])

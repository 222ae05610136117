"""Runs LeRobot 0.6.1's GR00T action head (`GR00TN17ActionHead` with `AlternateVLDiT`: N1.6's head)
at tiny widths on the CPU, as the oracle of trainkit's `gr00t` action head. Never imported by
trainkit: tests/test_gr00t_oracle.py calls it through the oracle venv's interpreter.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/groot_head_oracle.py IN.pt OUT.pt

IN.pt (torch.save): {"config": GR00TN17Config overrides, "inputs": backbone_features,
backbone_attention_mask, image_mask, state (B, 1, S), action, action_mask, noise, t (B,),
"weights": {name: a state_dict of the head in LeRobot's names}}. For each weight set OUT.pt holds
the predicted velocity (the action decoder's last `horizon` tokens), the loss, and the gradients
of the loss with respect to every head parameter and to the backbone features. The head's own
draws are replaced by the given ones: `sample_time` returns t, and the one `torch.randn` of its
forward returns the noise. Dropout is 0 and state dropout is 0 (the head also runs in eval mode).

Setup: python3.12 -m venv /tmp/lerobot-venv && /tmp/lerobot-venv/bin/pip install 'lerobot[pi]==0.6.1' diffusers dm-tree
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def run(doc: dict) -> dict:
    from transformers.feature_extraction_utils import BatchFeature

    from lerobot.policies.groot.groot_n1_7 import GR00TN17ActionHead, GR00TN17Config

    torch.set_default_dtype(torch.float32)
    head = GR00TN17ActionHead(GR00TN17Config(**doc["config"]))
    x = doc["inputs"]
    out = {}
    for name, weights in doc["weights"].items():
        head.load_state_dict(weights, strict=True)
        head.eval()  # no dropout (the test also builds it with dropout 0)
        head.zero_grad(set_to_none=True)
        head.sample_time = lambda b, device, dtype: x["t"].to(device, dtype)  # noqa: E731
        features = x["backbone_features"].clone().requires_grad_(True)
        captured = {}
        hook = head.action_decoder.register_forward_hook(lambda m, i, o: captured.setdefault("out", o))
        randn = torch.randn
        torch.randn = lambda *a, **k: x["noise"].clone()  # the head's one draw: the flow noise
        try:
            backbone = BatchFeature(data={"backbone_features": features,
                                          "backbone_attention_mask": x["backbone_attention_mask"],
                                          "image_mask": x["image_mask"]})
            action = BatchFeature(data={"state": x["state"], "action": x["action"], "action_mask": x["action_mask"],
                                        "embodiment_id": torch.zeros(x["action"].shape[0], dtype=torch.long)})
            loss = head(backbone, action)["loss"]
        finally:
            torch.randn = randn
            hook.remove()
        loss.backward()
        out[name] = {"pred": captured["out"][:, -x["action"].shape[1]:].detach(), "loss": loss.detach(),
                     "features_grad": features.grad,
                     "grads": {k: p.grad for k, p in head.named_parameters() if p.grad is not None}}
    return out


if __name__ == "__main__":
    torch.save(run(torch.load(sys.argv[1], weights_only=False)), sys.argv[2])

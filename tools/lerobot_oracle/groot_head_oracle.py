"""Runs LeRobot 0.6.1's GR00T N1.7 action head (`GR00TN17ActionHead`: LayerNorm, the VL
self-attention blocks, `AlternateVLDiT`, per-embodiment encoders and decoder) at tiny widths on the
CPU, as the oracle of trainkit's `gr00t` action head. Never imported by trainkit:
tests/trainkit/models/gr00t/test_gr00t_oracle.py calls it through the oracle venv's interpreter.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/groot_head_oracle.py IN.pt OUT.pt

IN.pt (torch.save): {"config": GR00TN17Config overrides, "inputs": backbone_features,
backbone_attention_mask, image_mask, state (B, 1, S), action, action_mask, noise, t (B,),
state_u (B,), embodiment (int), "weights": {name: a state_dict of the head in LeRobot's names}}.
For each weight set OUT.pt holds the predicted velocity (the action decoder's last `horizon`
tokens), the loss, and the gradients of the loss with respect to every head parameter and to the
backbone features. The head runs in training mode (its state dropout on) with its draws replaced
by the given ones: `sample_time` returns t, the one `torch.randn` of its forward returns the noise,
the one `torch.rand` (state dropout: dropped where < state_dropout_prob) returns state_u. The
config's dropout is 0, so the training-mode blocks are deterministic.

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
        head.train()
        head.zero_grad(set_to_none=True)
        head.sample_time = lambda b, device, dtype: x["t"].to(device, dtype)  # noqa: E731
        features = x["backbone_features"].clone().requires_grad_(True)
        captured = {}
        hook = head.action_decoder.register_forward_hook(lambda m, i, o: captured.setdefault("out", o))
        randn, rand = torch.randn, torch.rand
        torch.randn = lambda *a, **k: x["noise"].clone()  # the head's one normal draw: the flow noise
        torch.rand = lambda *a, **k: x["state_u"].clone()  # its one uniform draw: the state dropout
        try:
            backbone = BatchFeature(data={"backbone_features": features,
                                          "backbone_attention_mask": x["backbone_attention_mask"],
                                          "image_mask": x["image_mask"]})
            action = BatchFeature(data={"state": x["state"], "action": x["action"], "action_mask": x["action_mask"],
                                        "embodiment_id": torch.full((x["action"].shape[0],), x["embodiment"])})
            loss = head(backbone, action)["loss"]
        finally:
            torch.randn, torch.rand = randn, rand
            hook.remove()
        loss.backward()
        out[name] = {"pred": captured["out"][:, -x["action"].shape[1]:].detach(), "loss": loss.detach(),
                     "features_grad": features.grad,
                     "grads": {k: p.grad for k, p in head.named_parameters() if p.grad is not None}}
    return out


if __name__ == "__main__":
    torch.save(run(torch.load(sys.argv[1], weights_only=False)), sys.argv[2])

"""Runs diffusers' `WanTransformer3DModel` (0.42.1) at tiny widths on the CPU, as the oracle of the
`dreamzero` DiT run as plain Wan. Never imported by trainkit: tests/trainkit/models/dreamzero/test_dreamzero_diffusers_parity.py
calls it through the oracle venv's interpreter.

    /tmp/lerobot-venv/bin/python tools/diffusers_oracle/wan_oracle.py IN.pt OUT.pt

IN.pt (torch.save): {"config": WanTransformer3DModel keyword arguments, "weights": a state dict in
Wan's original names (trainkit's), "inputs": hidden_states (B, in_channels, F, H, W), timestep (B,),
encoder_hidden_states (B, 512, text_dim), encoder_hidden_states_image (B, 257, image_dim), target
(B, out_channels, F, H, W), weight (B, F)}. The weights go through diffusers' own
`convert_wan_transformer_to_diffusers` and load strictly. OUT.pt: the output, the loss
(mean over (B, F) of weight x the per-frame MSE against target) and every parameter's gradient,
mapped back to Wan's original names, and the name diffusers' conversion gives each original name.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def run(doc: dict) -> dict:
    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    torch.set_default_dtype(torch.float32)
    model = WanTransformer3DModel(**doc["config"])
    names = {}  # diffusers name -> original name: convert each key alone
    for key in doc["weights"]:
        (new,) = convert_wan_transformer_to_diffusers({key: torch.zeros(1)})
        names[new] = key
    converted = convert_wan_transformer_to_diffusers(dict(doc["weights"]))
    model.load_state_dict(converted, strict=True)
    x = doc["inputs"]
    out = model(x["hidden_states"], x["timestep"], x["encoder_hidden_states"], x["encoder_hidden_states_image"],
                return_dict=False)[0]
    loss = (((out - x["target"]) ** 2).mean(dim=(1, 3, 4)) * x["weight"]).mean()
    loss.backward()
    grads = {names[n]: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"out": out.detach(), "loss": loss.detach(), "grads": grads, "names": {v: k for k, v in names.items()}}


if __name__ == "__main__":
    doc = torch.load(sys.argv[1], weights_only=False)
    result = run(doc)
    tmp = sys.argv[2] + ".tmp"
    torch.save(result, tmp)
    os.replace(tmp, sys.argv[2])

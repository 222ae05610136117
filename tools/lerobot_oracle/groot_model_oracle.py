"""Loads a trainkit export of the `gr00t` family with LeRobot 0.6.1's `GR00TN17.from_pretrained` (the
whole N1.7: Qwen3-VL backbone and action head) at tiny widths on the CPU, nothing downloaded, and
runs its training forward and backward, as the oracle of trainkit's model end to end and of its
export. Never imported by trainkit: tests/trainkit/models/gr00t/test_gr00t_model_oracle.py calls it through the oracle
venv's interpreter.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/groot_model_oracle.py IN.pt OUT.pt

IN.pt (torch.save): {"folder": the export (config.json + model.safetensors, Isaac-GR00T's layout),
"qwen": the tiny Qwen3-VL config (LeRobot's hard-coded Cosmos-Reason2-2B config,
`_cosmos_reason2_qwen3_vl_config`, is patched to it), "tune_top_llm_layers", "inputs":
input_ids, attention_mask, pixel_values (transformers' patch layout), image_grid_thw, state
(B, 1, S), action, action_mask, embodiment_id, "noise", "t", "state_u"}. The model runs in
training mode with its draws replaced by the given ones (`sample_time` returns t, the head's one
`torch.randn` the noise, its one `torch.rand` the state-dropout draw; the export's dropout is 0).
OUT.pt: "state" (every tensor of the loaded model, its names), "missing" / "unexpected" keys of
the load, "loss", "pred" (the decoder's last `horizon` tokens), "features" (the backbone's),
"grads" (every parameter that trains: the head and the top LLM layers).

Setup: make lerobot-oracle
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def run(doc: dict) -> dict:
    from transformers import PreTrainedModel, Qwen3VLConfig

    import lerobot.policies.groot.groot_n1_7 as n17

    n17._cosmos_reason2_qwen3_vl_config = lambda: Qwen3VLConfig(**doc["qwen"])
    n17._register_with_transformers()
    # GR00TN17.from_pretrained minus its Hub lookup of the folder name (offline it can raise what it
    # does not catch): the PreTrainedModel load it delegates to, then its trainable-parameter setup
    model, info = PreTrainedModel.from_pretrained.__func__(
        n17.GR00TN17, doc["folder"], load_backbone_weights=False, dtype=torch.float32, output_loading_info=True,
        transformers_loading_kwargs={"trust_remote_code": True})
    model.backbone.set_trainable_parameters(tune_llm=False, tune_visual=False,
                                            tune_top_llm_layers=doc["tune_top_llm_layers"])
    model.action_head.set_trainable_parameters(tune_projector=True, tune_diffusion_model=True, tune_vlln=True)
    model.train()
    x = doc["inputs"]
    head = model.action_head
    head.sample_time = lambda b, device, dtype: doc["t"].to(device, dtype)  # noqa: E731
    captured = {}

    def keep(name, get):  # a forward hook that returns None: it records, never replaces the output
        return lambda m, i, o: captured.__setitem__(name, get(o))

    hooks = [head.action_decoder.register_forward_hook(keep("pred", lambda o: o)),
             model.backbone.register_forward_hook(keep("features", lambda o: o["backbone_features"].clone()))]
    randn, rand = torch.randn, torch.rand
    torch.randn = lambda *a, **k: doc["noise"].clone()
    torch.rand = lambda *a, **k: doc["state_u"].clone()
    try:
        loss = model(dict(x))["loss"]
    finally:
        torch.randn, torch.rand = randn, rand
        for h in hooks:
            h.remove()
    loss.backward()
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
            "loss": loss.detach(), "pred": captured["pred"][:, -x["action"].shape[1]:].detach(),
            "features": captured["features"].detach(),
            "grads": {k: p.grad for k, p in model.named_parameters() if p.requires_grad and p.grad is not None}}


if __name__ == "__main__":
    torch.set_default_dtype(torch.float32)
    torch.save(run(torch.load(sys.argv[1], weights_only=False)), sys.argv[2])

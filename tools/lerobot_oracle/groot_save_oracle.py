"""Builds LeRobot 0.6.1's `GR00TN17` from scratch at the given tiny sizes (nothing downloaded) and
saves it with its own `save_pretrained`: a checkpoint as LeRobot writes it, for trainkit's
`model.init_from` to read (tests/trainkit/models/gr00t/test_gr00t_init_from_shapes.py). Never imported by trainkit; run by
the oracle venv's interpreter.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/groot_save_oracle.py IN.pt

IN.pt (torch.save): {"folder": where to save, "qwen": the backbone's Qwen3-VL config (LeRobot's
hard-coded Cosmos-Reason2-2B config, `_cosmos_reason2_qwen3_vl_config`, is patched to it), "config":
the GR00TN17Config fields (the head's sizes), "seed"}.

Setup: make lerobot-oracle
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def save(doc: dict) -> None:
    from transformers import Qwen3VLConfig

    import lerobot.policies.groot.groot_n1_7 as n17

    n17._cosmos_reason2_qwen3_vl_config = lambda: Qwen3VLConfig(**doc["qwen"])
    n17._register_with_transformers()
    torch.manual_seed(doc["seed"])
    model = n17.GR00TN17(n17.GR00TN17Config(**doc["config"]), load_backbone_weights=False)
    model.save_pretrained(doc["folder"])


if __name__ == "__main__":
    torch.set_default_dtype(torch.float32)
    save(torch.load(sys.argv[1], weights_only=False))

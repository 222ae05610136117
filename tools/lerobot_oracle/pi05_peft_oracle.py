"""LeRobot 0.6.1's `PI05Policy` with peft's LoRA as the oracle of `trainkit export --format peft` (run
in the lerobot venv with peft importable; tests/trainkit/models/test_lora_lerobot.py).

    $LEROBOT_VENV/bin/python tools/lerobot_oracle/pi05_peft_oracle.py OUT.npz MERGED BASE ADAPTERS

MERGED: a tiny LoRA run's `--format lerobot` export (adapters merged); BASE: the same run's frozen
base in that layout; ADAPTERS: its `--format peft` export. It loads BASE with
`PI05Policy.from_pretrained` (strict), puts the adapters on it with `PeftModel.from_pretrained`
(peft's own key mapping: a wrong module name or shape fails there, or leaves an adapter unloaded,
which is refused), and writes the velocity of pi05_oracle.py's batch for the base alone, the base
with the adapters, and MERGED: "base", "peft", "merged".
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pi05_oracle import from_pretrained, make_inputs, patch_tiny, velocity_and_losses  # noqa: E402


def main(out: str, merged: str, base: str, adapters: str) -> None:
    import numpy as np
    import torch
    from peft import PeftModel

    patch_tiny()
    inputs = make_inputs(0)
    result = {}
    with torch.no_grad():
        result["merged"] = velocity_and_losses(from_pretrained(merged), inputs)[0].numpy()
        policy = from_pretrained(base)
        result["base"] = velocity_and_losses(policy, inputs)[0].numpy()
        wrapped = PeftModel.from_pretrained(policy, adapters)
        loaded = [n for n, _ in wrapped.named_parameters() if ".lora_" in n]
        if not loaded:
            raise SystemExit(f"{adapters}: peft injected no adapter into PI05Policy")
        result["peft"] = velocity_and_losses(policy, inputs)[0].numpy()
        result["adapters"] = np.array(sorted(loaded))
    np.savez(out, **result)


if __name__ == "__main__":
    main(*sys.argv[1:5])

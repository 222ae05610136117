"""`trainkit export RUN OUT --format peft`: a LoRA run's adapters alone, in peft's layout, for users
who keep the base checkpoint and load adapters on top (`PeftModel.from_pretrained(base, OUT)`).

    OUT/adapter_config.json        peft's LoraConfig: r, lora_alpha, target_modules (the adapted modules'
                                   full names), modules_to_save (modules the run trained in full)
    OUT/adapter_model.safetensors  base_model.model.<module>.lora_A.weight / .lora_B.weight per adapted
                                   linear (a fused linear's per part), base_model.model.<module>.<param>
                                   of each fully trained module

Module names are those of the family's checkpoint (`Weights.peft_names`; trainkit's own where the
family does not say: DreamZero's are Wan's original names). A run without adapters
(`model.lora_rank = 0`) is refused: its export is the whole model in a family format, where a LoRA
run's adapters are merged into their base weights (trainkit/models/lora.py `merged_state`).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from trainkit.models.lora import PEFT_PREFIX, lora_layers, peft_config, peft_tensors
from trainkit.parallel.names import clean_name

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"


def full_modules(model: nn.Module) -> list[str]:
    """The modules whose parameters train outside the adapters (the smallest module holding each)."""
    lora = lora_layers(model)
    out = set()
    for name, p in model.named_parameters():
        name = clean_name(name)
        if p.requires_grad and not any(name.startswith(path + ".") for path in lora):
            out.add(name.rpartition(".")[0])
    return sorted(out)


def adapter_files(model: nn.Module, names: Callable[[str, str], str], base_model: str,
                  dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(adapter_model.safetensors' tensors, adapter_config.json) of `model`'s adapters and fully
    trained modules, named by `names(trainkit module path, part)`."""
    state = {clean_name(k): v for k, v in model.state_dict().items()}
    tensors = peft_tensors(model, names, state)
    saved = full_modules(model)
    for module in saved:
        for k, v in state.items():
            if k.rpartition(".")[0] == module:
                tensors[PEFT_PREFIX + names(module, "") + "." + k.rpartition(".")[2]] = v
    config = peft_config(model, names, base_model)
    config["modules_to_save"] = [names(m, "") for m in saved] or None
    return {k: v.to(dtype, copy=True) for k, v in tensors.items()}, config


def write_adapters(tmp: Any, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Both files into the export's working folder (publish.py renames it whole)."""
    from safetensors.torch import save_file

    save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")

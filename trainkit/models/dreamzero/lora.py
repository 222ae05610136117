"""LoRA for the `dreamzero` DiT (`model.lora_rank`): DreamZero fine-tunes its Wan DiT with rank-4
LoRA on the blocks' q, k, v, o, ffn.0 and ffn.2 (the action/state encoders and decoder fully trained).

Why our own module and not `peft`: peft's `LoraLayer` is a wrapper whose forward dispatches on
adapter names, dropout and merge state at run time, and whose parameters live in per-adapter
ModuleDicts; FSDP2 (`fully_shard` per block) and torch.compile (one graph per block) want a plain
module with plain parameters and no Python state read in forward. peft is also not a dependency of
this project. The module below is what peft computes for one adapter without dropout:

    y = base_layer(x) + scale * lora_B(lora_A(x)),   scale = alpha / rank

with peft's names (`base_layer`, `lora_A`, `lora_B`: a DreamZero LoRA checkpoint's keys without
peft's `.default` adapter level) and peft's default init ("kaiming": A kaiming-uniform with a = sqrt(5),
B zero, so a fresh adapter changes nothing). `merged_weight` is the base plus scale B @ A: what an
export writes and what `model.init_from` folds a LoRA checkpoint into.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-r update (module docstring)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=base.weight.device)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=base.weight.device)
        self.scale = alpha / rank
        base.requires_grad_(False)

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scale

    @torch.no_grad()
    def init_lora(self) -> None:
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """base + scale B @ A in float32, cast back to base's dtype."""
    return (base.float() + scale * (b.float() @ a.float())).to(base.dtype)


def apply_lora(blocks: nn.ModuleList, targets: tuple[str, ...], rank: int, alpha: float) -> None:
    """Replace each block's linears named by `targets` ("q" in self- and cross-attention, "ffn.0",
    ...) by `LoRALinear`, freezing everything else of the blocks."""
    blocks.requires_grad_(False)
    for block in blocks:
        for name, module in list(block.named_modules()):
            parent, _, leaf = name.rpartition(".")
            if isinstance(module, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
                setattr(block.get_submodule(parent) if parent else block, leaf, LoRALinear(module, rank, alpha))

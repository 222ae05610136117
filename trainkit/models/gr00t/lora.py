"""Which linears of `gr00t` LoRA adapts (`model.lora_targets`, diffusers' Attention names as
Isaac-GR00T's checkpoints have them) and their names there (`trainkit export --format peft`;
trainkit/models/lora.py does the rest).

GR00T's backbone is frozen by default (Isaac-GR00T `tune_llm=False`, `tune_visual=False`; here
`lm_trained = 0`, the backbone under no_grad), so LoRA adapts the action head: Isaac-GR00T's
Isaac-GR00T's `get_lora_model` (github.com/NVIDIA/Isaac-GR00T, commit 041c544, its gr00t.utils.peft module) adapts every
linear whose name holds `to_q` or `to_v` (the action head's attention; its `q_proj`/`v_proj` are the
LLM's, frozen here) with r = 32 (its default), lora_alpha = 16 and dropout 0.1 (dropout is not
implemented here), and peft's default of no modules_to_save: everything else frozen. The VL
self-attention's and the DiT self-attention blocks' q, k, v are one fused `qkv` linear here, a cross
block's k, v one `kv`: each name adapts its rows (`Target.parts`).
"""
from __future__ import annotations

from trainkit.models.gr00t.action_head import block_context
from trainkit.models.lora import Target

LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out")
ISAAC_DEFAULT = ("to_q", "to_v")  # Isaac-GR00T get_lora_model's action-head targets
_DIT = "action_head.model.transformer_blocks."
_VL = "action_head.vl_self_attention.transformer_blocks."


def targets(cfg) -> list[Target]:
    """The Targets of `cfg.lora_targets` in the VL self-attention and the DiT."""
    chosen = set(cfg.lora_targets)

    def fused(path: str, kinds: str, width: int) -> list[Target]:
        parts = tuple((f"to_{k}", j * width, (j + 1) * width) for j, k in enumerate(kinds) if f"to_{k}" in chosen)
        return [Target(path, parts)] if parts else []

    out = []
    blocks = [(f"vl_blocks.{i}.", cfg.lm_width, "self") for i in range(cfg.vl_layers)]
    blocks += [(f"dit_blocks.{i}.", cfg.dit_width, block_context(i)) for i in range(cfg.dit_depth)]
    for at, width, kind in blocks:
        if kind == "self":
            out += fused(at + "qkv", "qkv", width)
        else:
            out += [Target(at + "q")] if "to_q" in chosen else []
            out += fused(at + "kv", "kv", width)
        out += [Target(at + "out")] if "to_out" in chosen else []
    return out


def peft_names(cfg, path: str, part: str) -> str:
    """A trainkit module (and part) under Isaac-GR00T's name (GR00T_N1's module path)."""
    kind, i, leaf = path.split(".")
    at = (_VL if kind == "vl_blocks" else _DIT) + f"{i}.attn1."
    return at + (part or {"q": "to_q", "out": "to_out.0"}[leaf])

"""Which linears of `pi05` LoRA adapts (`model.lora_targets`, in LeRobot's module names) and their
names in LeRobot's checkpoints (`trainkit export --format peft`; trainkit/models/lora.py does the rest).

LeRobot trains Pi0.5 with peft LoRA (`lerobot-train --peft.method_type=LORA`): lerobot 0.6.1
`lerobot/policies/pi05/modeling_pi05.py` `PI05Policy._get_default_peft_targets` adapts
`.*\\.gemma_expert\\..*\\.self_attn\\.(q|v)_proj` and `model\\.(action_in_proj|action_out_proj|...)`
(its `action_time_mlp_*` names are Pi0's: Pi0.5's `time_mlp_in/out` are not matched), with
`modules_to_save = []`, so everything else is frozen; `lerobot/configs/default.py` `PeftConfig`:
r = 16, lora_alpha None (peft's LoraConfig default 8), no dropout. These are the defaults here.
The action expert's q, k, v are one fused `qkv` linear in trainkit and its gate and up one
`gate_up`: each name adapts its part of the fused linear (trainkit/models/lora.py `Target.parts`),
as peft's separate adapters on LeRobot's unfused ones.
"""
from __future__ import annotations

from trainkit.models.lora import Target

# LeRobot's module name -> where it lives in trainkit ("expert": in each MoT layer's action expert)
EXPERT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROOT = {"action_in_proj": "action_in", "action_out_proj": "action_out", "time_mlp_in": "time_in",
        "time_mlp_out": "time_out"}
LORA_TARGETS = EXPERT + tuple(ROOT)
LEROBOT_DEFAULT = ("q_proj", "v_proj", "action_in_proj", "action_out_proj")  # PI05Policy's peft targets
_E = "model.paligemma_with_expert.gemma_expert.model.layers."  # LeRobot's action expert layers


def targets(cfg) -> list[Target]:
    """The Targets of `cfg.lora_targets` (fused parts in output-row order)."""
    q, kv, mlp = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim, cfg.expert_mlp
    rows = {"q_proj": ("qkv", 0, q), "k_proj": ("qkv", q, q + kv), "v_proj": ("qkv", q + kv, q + 2 * kv),
            "gate_proj": ("mlp.gate_up", 0, mlp), "up_proj": ("mlp.gate_up", mlp, 2 * mlp)}
    chosen = set(cfg.lora_targets)
    out = []
    for i in range(cfg.lm_depth):
        at = f"lm_layers.{i}.expert."
        for linear in ("qkv", "mlp.gate_up"):
            parts = tuple((n, a, b) for n, (lin, a, b) in rows.items() if lin == linear and n in chosen)
            if parts:
                out.append(Target(at + linear, parts))
        out += [Target(at + lin) for n, lin in (("o_proj", "out"), ("down_proj", "mlp.down")) if n in chosen]
    return out + [Target(ROOT[n]) for n in ROOT if n in chosen]


def peft_names(cfg, path: str, part: str) -> str:
    """A trainkit module (and part) under LeRobot's name (PI05Policy's module path)."""
    if path in ROOT.values():
        return "model." + next(n for n, p in ROOT.items() if p == path)
    layer, _, rest = path.removeprefix("lm_layers.").partition(".expert.")
    leaf = part or {"out": "o_proj", "mlp.down": "down_proj"}[rest]
    return f"{_E}{layer}.{'self_attn' if leaf.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{leaf}"

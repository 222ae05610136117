"""LoRA for every family (`model.lora_rank > 0`): a frozen `nn.Linear` plus a trainable rank-r update,
the linears it adapts named by the family (`Target`s from the family's model), the rest of the model
frozen except the parts the family trains in full.

    y = base_layer(x) + scale * lora_B(lora_A(x)),   scale = alpha / rank

Why our own module and not `peft`: peft's `LoraLayer` is a wrapper whose forward dispatches on
adapter names, dropout and merge state at run time, and whose parameters live in per-adapter
ModuleDicts; FSDP2 (`fully_shard` per block) and torch.compile (one graph per block) want a plain
module with plain parameters and no Python state read in forward. peft is an optional extra
(`pip install robodata[peft]`), used only by tests that load our adapters with it. The module
computes what peft computes for one adapter without dropout, with peft's names (`base_layer`,
`lora_A`, `lora_B`: a peft checkpoint's keys without its `.default` adapter level) and peft's
default init ("kaiming": A kaiming-uniform with a = sqrt(5), B zero, so a fresh adapter changes nothing).

A fused linear (Pi0.5's `qkv`, whose checkpoints hold q_proj, k_proj, v_proj) is adapted per part:
`Target.parts` names row ranges of its output, each with its own A (r x in) and B (rows x r), as
peft's separate adapters on the unfused linears compute; `lora_A` stacks the parts' A (one GEMM),
`lora_B` their B. Parts left out (k_proj when LeRobot adapts q and v) keep the base alone.

Export (`trainkit export`): `merged_state` folds every adapter into its base weight (base + scale
B @ A, in float32) under the base's plain name, the state a LoRA-free model of the same family
loads; `peft_tensors` / `peft_config` write the adapters in peft's layout (adapter_model.safetensors
keys `base_model.model.<module>.lora_A.weight`, adapter_config.json), the module names the family's
checkpoint names (`names`). Loading a checkpoint into a LoRA model (`model.init_from`) reads the
family's plain layout into the base layers and starts fresh adapters (`rename_plan`).

FLOPs of one adapted token (`adapter_flops`): forward 2 r (in x parts + rows adapted); backward
twice that (input and weight gradients of A and B), while the frozen base costs its forward and
its input gradient only (docs/fine-tuning.md, "LoRA").
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class Target:
    """One linear LoRA adapts: its module path in the model and, for a fused linear, the parts
    adapted as (name, first output row, end row); () adapts the whole linear as one."""

    path: str
    parts: tuple[tuple[str, int, int], ...] = ()


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-r update per part (module docstring)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, parts: tuple[tuple[str, int, int], ...] = ()):
        super().__init__()
        self.base_layer = base
        self.parts = parts
        rows = sum(b - a for _, a, b in parts) if parts else base.out_features
        self.lora_A = nn.Linear(base.in_features, rank * max(1, len(parts)), bias=False, device=base.weight.device)
        self.lora_B = nn.Linear(rank, rows, bias=False, device=base.weight.device)
        self.rank, self.scale = rank, alpha / rank
        base.requires_grad_(False)

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        h = self.lora_A(x)
        if not self.parts:
            return y + self.lora_B(h) * self.scale
        pieces, at, row = [], 0, 0
        b = self.lora_B.weight
        for j, (_, first, end) in enumerate(self.parts):
            pieces.append(y[..., at:first])
            delta = F.linear(h[..., j * self.rank:(j + 1) * self.rank], b[row:row + end - first])
            pieces.append(y[..., first:end] + delta * self.scale)
            at, row = end, row + end - first
        pieces.append(y[..., at:])
        return torch.cat(pieces, dim=-1)

    @torch.no_grad()
    def init_lora(self) -> None:
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def adapters(self) -> list[tuple[str, torch.Tensor, torch.Tensor, int, int]]:
        return split_adapters(self.parts, self.rank, self.lora_A.weight, self.lora_B.weight)


def split_adapters(parts: tuple[tuple[str, int, int], ...], rank: int, a: torch.Tensor, b: torch.Tensor
                   ) -> list[tuple[str, torch.Tensor, torch.Tensor, int, int]]:
    """(part name, A, B, first row, end row) per adapted part of stacked `a`, `b` ("" and the whole
    output when unfused)."""
    if not parts:
        return [("", a, b, 0, b.shape[0])]
    out, row = [], 0
    for j, (name, first, end) in enumerate(parts):
        out.append((name, a[j * rank:(j + 1) * rank], b[row:row + end - first], first, end))
        row += end - first
    return out


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """base + scale B @ A in float32, cast back to base's dtype."""
    return (base.float() + scale * (b.float() @ a.float())).to(base.dtype)


def apply_lora(model: nn.Module, targets: Iterable[Target], rank: int, alpha: float) -> list[str]:
    """Replace each target linear of `model` by a `LoRALinear` (its base frozen); returns the paths."""
    done = []
    for t in targets:
        parent, _, leaf = t.path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        base = getattr(owner, leaf)
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRA target {t.path!r} is a {type(base).__name__}, not an nn.Linear")
        setattr(owner, leaf, LoRALinear(base, rank, alpha, t.parts))
        done.append(t.path)
    return done


def suffix_targets(module: nn.Module, names: Iterable[str], prefix: str = "") -> list[Target]:
    """Every nn.Linear under `module` whose path is one of `names` or ends in "." + one of them
    (peft's `target_modules` as a list of suffixes), as Targets under `prefix`."""
    names = tuple(names)
    return [Target(prefix + path) for path, m in module.named_modules()
            if isinstance(m, nn.Linear) and any(path == n or path.endswith("." + n) for n in names)]


def init_lora(model: nn.Module) -> None:
    """Every adapter of `model` to peft's fresh init (after a family's init_weights)."""
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.init_lora()


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {path: m for path, m in model.named_modules() if isinstance(m, LoRALinear)}


def merged_state(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """`model`'s state dict (or `state`, of the same model) with every adapter folded into its base
    weight, under the base's plain names (`X.weight`, `X.bias`): a LoRA-free model's state."""
    state = dict(model.state_dict() if state is None else state)
    for path, m in lora_layers(model).items():
        base = state.pop(f"{path}.base_layer.weight")
        a, b = state.pop(f"{path}.lora_A.weight"), state.pop(f"{path}.lora_B.weight")
        w = base.float().clone()
        for _, pa, pb, first, end in split_adapters(m.parts, m.rank, a, b):
            w[first:end] += m.scale * (pb.float() @ pa.float())
        state[f"{path}.weight"] = w.to(base.dtype)
        if f"{path}.base_layer.bias" in state:
            state[f"{path}.bias"] = state.pop(f"{path}.base_layer.bias")
    return state


Names = Callable[[str, str], str]  # (trainkit module path, part name or "") -> the checkpoint's module path


def peft_tensors(model: nn.Module, names: Names, state: Mapping[str, torch.Tensor] | None = None
                 ) -> dict[str, torch.Tensor]:
    """The adapters as peft saves them (adapter_model.safetensors): `base_model.model.<module>.lora_A.weight`
    and `.lora_B.weight`, one pair per adapted linear (a fused linear's per part), `names` giving
    each module's name in the family's checkpoint."""
    state = model.state_dict() if state is None else state
    out = {}
    for path, m in lora_layers(model).items():
        a, b = state[f"{path}.lora_A.weight"], state[f"{path}.lora_B.weight"]
        for part, a, b, _, _ in split_adapters(m.parts, m.rank, a, b):
            stem = PEFT_PREFIX + names(path, part)
            out[f"{stem}.lora_A.weight"], out[f"{stem}.lora_B.weight"] = a, b
    return out


def peft_config(model: nn.Module, names: Names, base_model: str = "") -> dict[str, Any]:
    """adapter_config.json for `peft_tensors`: LoRA of the model's rank and alpha on exactly those
    modules (their full names as `target_modules`), no dropout, no bias, peft's kaiming init."""
    layers = lora_layers(model)
    first = next(iter(layers.values()))
    modules = sorted({names(path, part) for path, m in layers.items() for part, *_ in m.adapters()})
    return {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model or None,
            "r": first.rank, "lora_alpha": first.scale * first.rank, "lora_dropout": 0.0, "bias": "none",
            "target_modules": modules, "modules_to_save": None, "fan_in_fan_out": False,
            "init_lora_weights": True, "use_rslora": False, "use_dora": False, "inference_mode": True}


@dataclass(frozen=True)
class Fresh:
    """A load rule with no source: the parameter keeps its init (a fresh adapter)."""

    target: str
    sources: tuple[str, ...] = ()


def rename_plan(model: nn.Module, rules: list[Any]) -> list[Any]:
    """A family's read rules for the LoRA-free model (targets `X.weight`) turned to `model`'s names:
    an adapted linear's base as `X.base_layer.weight`, each adapter fresh."""
    layers = lora_layers(model)
    out = []
    for r in rules:
        stem, _, kind = r.target.rpartition(".")
        out.append(replace(r, target=f"{stem}.base_layer.{kind}") if stem in layers else r)
    return out + [Fresh(f"{p}.lora_{ab}.weight") for p in layers for ab in ("A", "B")]


def without_lora(cfg: Any) -> Any:
    """The family config with LoRA off (its checkpoint layout is the plain model's)."""
    return replace(cfg, lora_rank=0) if getattr(cfg, "lora_rank", 0) else cfg


def check_lora_fields(cls_name: str, rank: Any, alpha: Any, targets: tuple[str, ...], known: tuple[str, ...]) -> str | None:
    """The first problem of a config's LoRA fields (a family's __post_init__ raises it), else None."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        return f"{cls_name}.lora_rank must be an int >= 0, got {rank!r}"
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        return f"{cls_name}.lora_alpha must be a finite number > 0, got {alpha!r}"
    unknown = sorted(set(targets) - set(known))
    if unknown or not targets:
        return f"{cls_name}.lora_targets {list(targets)}: each one of {', '.join(known)}"
    return None

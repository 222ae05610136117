"""The `dreamzero` family's mapping to the checkpoints users have (`model.init_from`, `trainkit export`).

Formats (detected from the keys; trainkit's parameter names are Wan's original ones):
- "dreamzero": the official whole-model save, the DiT under `action_head.model.` in Wan's names
  (with `state_encoder`, `action_encoder`, `action_decoder`); `action_head.text_encoder.*`,
  `image_encoder.*` and `vae.*` are not read (the feature cache used them). A LoRA save wraps the
  DiT as peft does, `action_head.model.base_model.model.` + the name, each adapted linear as
  `{base_layer, lora_A[.default], lora_B[.default]}`: merged on load, W = base + (alpha / r) B @ A
  (alpha: `model.lora_alpha`, r: the adapter's rows).
- "wan": a Wan2.1 / Wan2.2 base DiT in its original names (optionally under
  `model.diffusion_model.`, as ComfyUI saves it); the action/state MLPs keep their fresh init, and
  so do the image K/V and image projection that a T2V/TI2V checkpoint (Wan2.2-TI2V-5B) lacks.
- "diffusers": a `WanTransformer3DModel` folder (transformer/): names mapped by the table of
  diffusers' `convert_wan_transformer_to_diffusers` (cross_attn -> attn2, norm2 <-> norm3, ...).
Sharded safetensors with an index are read as one checkpoint (trainkit/weights/load.py).
A rule with no sources keeps the parameter's own init (load.py); a model with LoRA on
(`model.lora_rank`) takes the (merged) weights as its frozen base and starts fresh adapters.
`trainkit export --format dreamzero` writes the whole-model layout back (LoRA merged).
"""
from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from trainkit.errors import WeightsError
from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.lora import merged_weight
from trainkit.models.family import Fixed, WeightsFiles

FORMATS = ("dreamzero", "wan", "diffusers")
DZ = "action_head.model."
DZ_LORA = DZ + "base_model.model."
ROBOT = ("state_encoder.", "action_encoder.", "action_decoder.")
IMAGE = ("img_emb.", ".k_img.", ".v_img.", ".norm_k_img.")  # absent from T2V / TI2V checkpoints
# Wan original -> diffusers name fragments, applied in order (diffusers' conversion table, read from
# diffusers 0.42.1; the norm2/norm3 swap goes through a placeholder)
DIFFUSERS = (("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
             ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
             ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
             ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
             ("time_projection.1", "condition_embedder.time_proj"), ("cross_attn", "attn2"), ("self_attn", "attn1"),
             (".o.", ".to_out.0."), (".q.", ".to_q."), (".k.", ".to_k."), (".v.", ".to_v."),
             (".k_img.", ".add_k_proj."), (".v_img.", ".add_v_proj."), (".norm_k_img.", ".norm_added_k."),
             ("head.modulation", "scale_shift_table"), ("head.head", "proj_out"), ("modulation", "scale_shift_table"),
             ("ffn.0", "ffn.net.0.proj"), ("ffn.2", "ffn.net.2"), ("norm2", "norm__swap"), ("norm3", "norm2"),
             ("norm__swap", "norm3"), ("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),
             ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
             ("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"),
             ("img_emb.proj.4", "condition_embedder.image_embedder.norm2"))
_ADAPTER = re.compile(r"\.(lora_A|lora_B)\.weight$")


def diffusers_name(name: str) -> str:
    for old, new in DIFFUSERS:
        name = name.replace(old, new)
    return name


@dataclass(frozen=True)
class Rule:
    """One trainkit parameter from checkpoint tensors. op "copy": the one source; "lora": sources
    (base, A, B) merged as base + alpha / r B @ A. No source: the parameter keeps its init."""

    target: str
    sources: tuple[str, ...]
    op: Literal["copy", "lora"] = "copy"
    alpha: float = 0.0

    def gather(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if self.op == "lora":
            base, a, b = tensors
            if a.shape[0] == 0:  # alpha / r with r = 0
                raise WeightsError(f"LoRA tensor {self.sources[1]!r} has rank 0 (shape {list(a.shape)}): "
                                   "no adapter to merge")
            return merged_weight(base, a, b, self.alpha / a.shape[0])
        return tensors[0]


def detect(keys: Collection[str]) -> str:
    if any(k.startswith(DZ) for k in keys):
        return "dreamzero"
    if any(k.startswith("condition_embedder.") for k in keys):
        return "diffusers"
    if any(k.endswith("patch_embedding.weight") for k in keys):
        return "wan"
    raise WeightsError("neither a DreamZero checkpoint (action_head.model.*), a Wan DiT (patch_embedding.weight) "
                       "nor a diffusers WanTransformer3DModel (condition_embedder.*)")


def wan_name(param: str) -> str | None:
    """Our parameter's name in Wan's original layout; None for a LoRA adapter (never read)."""
    if _ADAPTER.search(param):
        return None
    return param.replace(".base_layer.", ".")


def read_plan(cfg: DreamZeroConfig, keys: set[str]) -> tuple[str, list[Rule]]:
    from trainkit.models.dreamzero.model import DreamZero

    fmt = detect(keys)
    with torch.device("meta"):
        names = [n for n, _ in DreamZero(cfg).named_parameters()]
    lora = fmt == "dreamzero" and any(k.startswith(DZ_LORA) for k in keys)
    prefix = "model.diffusion_model." if fmt == "wan" and any(k.startswith("model.diffusion_model.") for k in keys) \
        else ""
    rules = []
    for param in names:
        name = wan_name(param)
        if name is None:
            rules.append(Rule(param, ()))
            continue
        if fmt == "dreamzero":
            rules.append(_dreamzero_rule(param, name, keys, lora, cfg.lora_alpha))
            continue
        key = prefix + name if fmt == "wan" else diffusers_name(name)
        optional = name.startswith(ROBOT) or any(part in "." + name for part in IMAGE)
        rules.append(Rule(param, () if optional and key not in keys else (key,)))
    return fmt, rules


def _dreamzero_rule(param: str, name: str, keys: set[str], lora: bool, alpha: float) -> Rule:
    if not lora:
        return Rule(param, (DZ + name,))
    stem, _, kind = name.rpartition(".")
    base = f"{DZ_LORA}{stem}.base_layer.{kind}"
    if base not in keys:  # not adapted: the plain name under peft's wrapper
        return Rule(param, (DZ_LORA + name,))
    if kind == "bias":
        return Rule(param, (base,))
    a, b = (next((k for k in (f"{DZ_LORA}{stem}.{ab}.default.weight", f"{DZ_LORA}{stem}.{ab}.weight") if k in keys),
                 f"{DZ_LORA}{stem}.{ab}.weight") for ab in ("lora_A", "lora_B"))
    return Rule(param, (base, a, b), "lora", alpha)


def export_tensors(cfg: DreamZeroConfig, state: Mapping[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """The model's tensors in `fmt`'s names, LoRA adapters merged into their base weights."""
    merged: dict[str, torch.Tensor] = {}
    scale = cfg.lora_alpha / cfg.lora_rank if cfg.lora_rank else 0.0
    for param, t in state.items():
        name = wan_name(param)
        if name is None:
            continue
        if ".base_layer.weight" in param:
            stem = param.removesuffix(".base_layer.weight")
            t = merged_weight(t, state[f"{stem}.lora_A.weight"], state[f"{stem}.lora_B.weight"], scale)
        merged[name] = t
    if fmt == "dreamzero":
        return {DZ + k: v for k, v in merged.items()}
    if fmt == "wan":
        return {k: v for k, v in merged.items() if not k.startswith(ROBOT)}
    if fmt == "diffusers":
        return {diffusers_name(k): v for k, v in merged.items() if not k.startswith(ROBOT)}
    raise WeightsError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def config_json(cfg: DreamZeroConfig, info: Mapping[str, Any]) -> dict[str, Any]:
    """Wan's config.json fields (what Wan's and DreamZero's loaders read) plus DreamZero's token counts."""
    return {"model_type": "i2v", "dim": cfg.dim, "num_layers": cfg.depth, "num_heads": cfg.heads, "ffn_dim": cfg.ffn,
            "in_dim": cfg.in_dim, "out_dim": cfg.latent_channels, "text_len": cfg.text_len, "text_dim": cfg.text_width,
            "freq_dim": cfg.freq_dim, "eps": cfg.eps, "patch_size": list(cfg.patch),
            "concat_first_frame_latent": cfg.first_frame_concat, "frame_seqlen": cfg.tokens_per_frame,
            "num_frame_per_block": cfg.frames_per_block, "num_action_per_block": cfg.actions_per_block,
            "num_state_per_block": cfg.states_per_block, "action_dim": cfg.action_dim,
            "max_state_dim": cfg.state_dim, "hidden_size": cfg.mlp_hidden}


def config_from_weights(files: WeightsFiles, preset: DreamZeroConfig, given: Mapping[str, Any]) -> Fixed:
    """Every DreamZeroConfig field the checkpoint fixes, with where it is read: widths, depth, FFN,
    the patch (patch_embedding's kernel), channels from the tensors' shapes; the head count from config.json (`num_heads`, Wan's and
    DreamZero's, or `num_attention_heads`, diffusers'), else the run's or the preset's head size kept."""
    fmt = detect(files.shapes)
    prefix = DZ if fmt == "dreamzero" else ""
    if fmt == "dreamzero" and any(k.startswith(DZ_LORA) for k in files.shapes):
        prefix = DZ_LORA
    if fmt == "wan" and any(k.startswith("model.diffusion_model.") for k in files.shapes):
        prefix = "model.diffusion_model."

    def key(name: str) -> str:
        k = prefix + (diffusers_name(name) if fmt == "diffusers" else name)
        if k not in files.shapes and fmt == "dreamzero" and prefix == DZ_LORA:
            k = prefix + name.replace(".weight", ".base_layer.weight")
        return k

    def shape(name: str) -> tuple[int, ...]:
        got = files.shapes.get(key(name))
        if got is None:
            raise WeightsError(f"missing key {key(name)!r} (the model's shape is read from it)")
        return tuple(got)

    def at(name: str, what: str) -> str:
        return f"model.safetensors {key(name)!r} {what}"

    out: Fixed = {}
    embed = shape("patch_embedding.weight")
    dim, in_dim = embed[:2]
    out["dim"] = (dim, at("patch_embedding.weight", "rows"))
    patch = tuple(embed[2:]) if len(embed) == 5 else preset.patch  # Conv3d (frames, height, width) kernel
    if len(embed) == 5:
        out["patch"] = (patch, at("patch_embedding.weight", "kernel"))
    patch_volume = patch[0] * patch[1] * patch[2]
    channels = shape("head.head.weight")[0] // patch_volume
    out["latent_channels"] = (channels, at("head.head.weight", f"rows / {patch_volume}"))
    out["first_frame_concat"] = (in_dim == 2 * channels + 4, at("patch_embedding.weight", f"columns {in_dim}"))
    if in_dim not in (channels, 2 * channels + 4):
        raise WeightsError(f"patch_embedding takes {in_dim} channels for {channels} latent ones: neither Wan2.2's "
                           f"{channels} nor Wan2.1-I2V's {2 * channels + 4}")
    blocks = {int(m.group(1)) for k in files.shapes for m in [re.match(re.escape(prefix) + r"blocks\.(\d+)\.", k)] if m}
    out["depth"] = (len(blocks), f"model.safetensors {prefix}blocks.*")
    out["ffn"] = (shape("blocks.0.ffn.0.weight")[0], at("blocks.0.ffn.0.weight", "rows"))
    out["text_width"] = (shape("text_embedding.0.weight")[1], at("text_embedding.0.weight", "columns"))
    out["freq_dim"] = (shape("time_embedding.0.weight")[1], at("time_embedding.0.weight", "columns"))
    if key("img_emb.proj.1.weight") in files.shapes:
        out["image_width"] = (shape("img_emb.proj.1.weight")[1], at("img_emb.proj.1.weight", "columns"))
    if fmt == "dreamzero":
        w1, s1 = shape("action_encoder.W1.W"), shape("state_encoder.layer1.W")
        out["action_dim"] = (w1[1], at("action_encoder.W1.W", "rows"))
        out["state_dim"], out["mlp_hidden"] = (s1[1], at("state_encoder.layer1.W", "rows")), \
            (s1[2], at("state_encoder.layer1.W", "columns"))
    heads = files.config.get("num_heads", files.config.get("num_attention_heads"))
    if isinstance(heads, int) and heads > 0:
        out["heads"] = (heads, "config.json num_heads")
    else:
        head_dim = preset.dim // preset.heads if "heads" not in given else dim // given["heads"]
        out["heads"] = (dim // head_dim, f"the preset's head size {head_dim} (config.json names no head count)")
    return out

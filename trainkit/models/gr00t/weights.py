"""The `gr00t` family's mapping to GR00T N1.7 checkpoints, both ways: Isaac-GR00T's (`GR00TN17`'s
`save_pretrained`, the published `nvidia/GR00T-N1.7-3B` and its fine-tunes) and LeRobot 0.6.1's
(`GrootPolicy`: the same names under `_groot_model.`).

Layouts (detected from the keys): "isaac": `action_head.*` and `backbone.model.*`; "lerobot":
`_groot_model.action_head.*` and `_groot_model.backbone.model.*`.
What the mapping does (checked against LeRobot 0.6.1 by tests/trainkit/models/gr00t/test_gr00t_oracle.py):
- per-embodiment layers (`CategorySpecificLinear`: W (embodiments, in, out), b (embodiments, out))
  load one embodiment's slice, `model.embodiment` (LeRobot's "new_embodiment" is 10); an export
  writes the full tensors back: the other slots from the checkpoint the run started from
  (`model.init_from`), zeros when it started from scratch;
- the self-attention q/k/v (VL blocks, the DiT's odd blocks) are fused here (`qkv`), and a cross
  block's k/v (`kv`): rows concatenated;
- the backbone's parameters are the checkpoint's under `backbone.model.model.` (qwen3_vl/backbone.py's
  BACKBONE_PREFIX) with transformers' names: the ViT's blocks (`vision_blocks.i` here) are
  `visual.blocks.i`, the rest of the ViT `visual.*`, the embedding `language_model.embed_tokens`,
  the LLM layers (`lm_frozen.i`, then `lm_layers.j`) `language_model.layers.k`. Not read: the LLM
  layers from `select_layer` on (Isaac-GR00T deletes them before saving), its final norm and the
  tied `lm_head` (the features are taken before them).
The model's shape comes from config.json (`config_from_weights`): Isaac-GR00T's class defaults
and LeRobot's disagree (select_layer, DiT depth, VL self-attention blocks, state dropout), so the
checkpoint's own values decide, each checked against the tensors where they hold it. config.json
names the backbone only, so its shapes (ViT, vocabulary, LLM widths and heads) come from the
safetensors header (backbone_shape.py).
"""
from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from trainkit.errors import WeightsError
from trainkit.models.family import Fixed, WeightsFiles
from trainkit.models.gr00t.action_head import block_context
from trainkit.models.gr00t.backbone_shape import backbone_from_header
from trainkit.models.gr00t.batches import N17_CROP_FRACTION, eval_crop
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.qwen3_vl.backbone import BACKBONE_PREFIX

FORMATS = ("isaac", "lerobot")
PREFIX = {"isaac": "", "lerobot": "_groot_model."}
H = "action_head."
DIT = H + "model."
VL = H + "vl_self_attention.transformer_blocks."
FINAL_NORM = BACKBONE_PREFIX + "language_model.norm.weight"  # not read (the features are taken before it)


@dataclass(frozen=True)
class Rule:
    """One trainkit parameter from checkpoint tensors. op "copy": the one source; "cat": the sources'
    rows concatenated (`rows` splits them again on export); "slice": row `embodiment` of the one
    per-embodiment source."""

    target: str
    sources: tuple[str, ...]
    op: Literal["copy", "cat", "slice"] = "copy"
    rows: tuple[int, ...] = ()
    embodiment: int = 0

    def gather(self, tensors: list[torch.Tensor], *, gradient: bool = False) -> torch.Tensor:
        """The trainkit tensor from the sources' tensors (`gradient`: the same map, gradients are linear in it)."""
        if self.op == "slice":
            return tensors[0][self.embodiment]
        return torch.cat(tensors, dim=0) if len(tensors) > 1 else tensors[0]

    def scatter(self, value: torch.Tensor, base: Mapping[str, torch.Tensor],
                slots: int) -> dict[str, torch.Tensor]:
        """The sources' tensors from the trainkit tensor; "slice": `base`'s full tensor (zeros of
        `slots` rows when it lacks one) with this embodiment's row replaced."""
        if self.op == "slice":
            key = self.sources[0]
            full = base[key].to(value.dtype).clone() if key in base else value.new_zeros((slots, *value.shape))
            full[self.embodiment] = value
            return {key: full}
        return dict(zip(self.sources, value.split(list(self.rows), dim=0) if self.rows else [value]))


def _linear(target: str, source: str) -> list[Rule]:
    return [Rule(f"{target}.{w}", (f"{source}.{w}",)) for w in ("weight", "bias")]


def _per_embodiment(target: str, source: str, e: int) -> list[Rule]:
    return [Rule(f"{target}.weight", (f"{source}.W",), "slice", embodiment=e),
            Rule(f"{target}.bias", (f"{source}.b",), "slice", embodiment=e)]


def _attention(target: str, source: str, kinds: str, width: int) -> list[Rule]:
    """q/k/v (`kinds` "qkv" fused, or "kv") of a diffusers Attention `source` (attn1)."""
    return [Rule(f"{target}.{w}", tuple(f"{source}.to_{k}.{w}" for k in kinds), "cat", rows=(width,) * len(kinds))
            for w in ("weight", "bias")]


def head_rules(cfg: Gr00tConfig) -> list[Rule]:
    """Every head parameter's rule (names without the format's prefix)."""
    e, lw, dw = cfg.embodiment, cfg.lm_width, cfg.dit_width
    out = _linear("vl_norm", H + "vlln")
    for i in range(cfg.vl_layers):
        src, dst = f"{VL}{i}.", f"vl_blocks.{i}."
        out += (_linear(dst + "norm1", src + "norm1") + _attention(dst + "qkv", src + "attn1", "qkv", lw)
                + _linear(dst + "out", src + "attn1.to_out.0") + _linear(dst + "norm3", src + "norm3")
                + _linear(dst + "ff.ff_in", src + "ff.net.0.proj") + _linear(dst + "ff.ff_out", src + "ff.net.2"))
    out += (_linear("time_embed.fc1", DIT + "timestep_encoder.timestep_embedder.linear_1")
            + _linear("time_embed.fc2", DIT + "timestep_encoder.timestep_embedder.linear_2"))
    for name in ("state_encoder.layer1", "state_encoder.layer2", "action_encoder.W1", "action_encoder.W2",
                 "action_encoder.W3", "action_decoder.layer1", "action_decoder.layer2"):
        out += _per_embodiment(name, H + name, e)
    out.append(Rule("action_pos.weight", (H + "position_embedding.weight",)))
    for i in range(cfg.dit_depth):
        src, dst = f"{DIT}transformer_blocks.{i}.", f"dit_blocks.{i}."
        out += _linear(dst + "ada", src + "norm1.linear")
        if block_context(i) == "self":
            out += _attention(dst + "qkv", src + "attn1", "qkv", dw)
        else:
            out += [Rule(f"{dst}q.{w}", (f"{src}attn1.to_q.{w}",)) for w in ("weight", "bias")]
            out += _attention(dst + "kv", src + "attn1", "kv", dw)
        out += (_linear(dst + "out", src + "attn1.to_out.0") + _linear(dst + "ff.ff_in", src + "ff.net.0.proj")
                + _linear(dst + "ff.ff_out", src + "ff.net.2"))
    return out + _linear("dit_out.ada", DIT + "proj_out_1") + _linear("dit_out.proj", DIT + "proj_out_2")


def backbone_name(name: str, cfg: Gr00tConfig) -> str:
    """The checkpoint's name (below BACKBONE_PREFIX) of a backbone parameter of the model."""
    first, _, rest = name.partition(".")
    if first == "vision_blocks":
        return "visual.blocks." + rest
    if first == "embed":
        return "language_model.embed_tokens." + rest
    if first in ("lm_frozen", "lm_layers"):
        i, _, rest = rest.partition(".")
        return f"language_model.layers.{int(i) + (cfg.lm_frozen if first == 'lm_layers' else 0)}.{rest}"
    return name  # visual.*


def backbone_rules(cfg: Gr00tConfig) -> list[Rule]:
    """The backbone's parameters (every one the head's rules do not fill): one checkpoint tensor each."""
    from trainkit.models.gr00t.model import Gr00t

    head = {r.target for r in head_rules(cfg)}
    with torch.device("meta"):
        names = [n for n, _ in Gr00t(cfg).named_parameters() if n not in head]
    return [Rule(n, (BACKBONE_PREFIX + backbone_name(n, cfg),)) for n in names]


def detect(keys: Collection[str]) -> str:
    """The format of a checkpoint with these keys; WeightsError naming a key if neither."""
    if any(k.startswith(PREFIX["lerobot"] + H) for k in keys):
        return "lerobot"
    if any(k.startswith(H) for k in keys):
        return "isaac"
    first = min(keys, default="(none)")
    raise WeightsError(f"not a GR00T N1.7 checkpoint: no key starts with {H!r} (Isaac-GR00T) or "
                       f"{PREFIX['lerobot'] + H!r} (LeRobot); first key {first!r}")


def rules(cfg: Gr00tConfig) -> list[Rule]:
    """Every parameter's rule: the head's and the backbone's."""
    return head_rules(cfg) + backbone_rules(cfg)


def read_plan(cfg: Gr00tConfig, keys: Collection[str]) -> tuple[str, list[Rule]]:
    """(format, rules with full key names) for a checkpoint holding `keys`."""
    fmt = detect(keys)
    return fmt, [replace(r, sources=tuple(PREFIX[fmt] + s for s in r.sources)) for r in rules(cfg)]


def export_tensors(cfg: Gr00tConfig, state: Mapping[str, torch.Tensor], fmt: str,
                   base: Mapping[str, torch.Tensor] = {}) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of format `fmt` from trainkit's state dict; `base`: the start
    checkpoint's per-embodiment tensors (keys without the format's prefix), whose other slots are kept."""
    if fmt not in FORMATS:
        raise WeightsError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    out = {}
    for rule in rules(cfg):
        out.update(rule.scatter(state[rule.target], base, cfg.embodiments))
    if fmt == "lerobot":  # GrootPolicy's strict load asks for the LLM's final norm, which no feature passes through
        out[FINAL_NORM] = torch.ones(cfg.lm_width)
    return {PREFIX[fmt] + k: v for k, v in out.items()}


def start_keys(cfg: Gr00tConfig, keys: Collection[str]) -> dict[str, str]:
    """{a start checkpoint's key: the name `export_tensors` reads it under in `base`}: the
    per-embodiment tensors, whose other embodiments' slots an export keeps."""
    prefix = PREFIX[detect(keys)]
    return {prefix + r.sources[0]: r.sources[0] for r in head_rules(cfg) if r.op == "slice"}


# --- the model's shape from a checkpoint (model.init_from) ------------------------------------------
# config.json key (Isaac-GR00T's Gr00tN1d7 config, as LeRobot's GR00TN17Config mirrors it) -> Gr00tConfig field
CONFIG_KEYS = {"select_layer": "lm_depth", "max_state_dim": "state_dim", "max_action_dim": "action_dim",
               "action_horizon": "horizon", "hidden_size": "head_hidden", "input_embedding_dim": "dit_width",
               "backbone_embedding_dim": "lm_width", "max_seq_len": "max_positions",
               "num_timestep_buckets": "time_buckets", "max_num_embodiments": "embodiments"}
PROBABILITIES = {"state_dropout_prob": "state_dropout"}
NESTED = {"diffusion_model_cfg": {"num_layers": "dit_depth", "num_attention_heads": "dit_heads", "dropout": "dropout"},
          "vl_self_attention_cfg": {"num_layers": "vl_layers", "num_attention_heads": "vl_heads",
                                    "attention_head_dim": "vl_head_dim"}}


def config_from_weights(files: WeightsFiles, preset: Gr00tConfig, given: Mapping[str, Any]) -> Fixed:
    """Every Gr00tConfig field the checkpoint's config.json fixes, with where it says so, each
    checked against the tensors that hold it (state, action and embodiment counts, widths, depths),
    and the folder as the tokenizer's when it holds tokenizer.json (unless the run names its own).
    Its dropout and state dropout are the ones the checkpoint trained with, fixed too (the issue's
    "the checkpoint decides"); how many LLM layers train (tune_top_llm_layers) is the run's choice."""
    config = base_config(files) if files.config.get("type") == "groot" else files.config
    if not any(k in config for k in ("select_layer", "action_head_cfg", "diffusion_model_cfg")):
        raise WeightsError("not a GR00T N1.7 config: it has no select_layer / diffusion_model_cfg", "config.json")
    out: Fixed = {}
    for key, name in CONFIG_KEYS.items():
        if key in config:
            out[name] = (_count(config, key), f"config.json {key}")
    for key, name in PROBABILITIES.items():
        if key in config:
            out[name] = (_probability(config, key), f"config.json {key}")
    for group, keys in NESTED.items():
        sub = config.get(group)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise WeightsError(f"{group} is {type(sub).__name__}, not an object", "config.json")
        for key, name in keys.items():
            if key in sub:
                where = f"config.json {group}.{key}"
                out[name] = (_probability(sub, key) if name == "dropout" else _count(sub, key, zero=name == "vl_layers"),
                             where)
    for folder in (Path(files.folder), Path(files.folder) / "tokenizer") if files.folder else ():
        if (folder / "tokenizer.json").is_file() and "tokenizer" not in given:
            out["tokenizer"] = (str(folder), f"the checkpoint's {folder.name}/tokenizer.json")
            break
    if "dit_width" in out:
        out["dit_ff"] = (4 * out["dit_width"][0], "4 x config.json input_embedding_dim (diffusers' FeedForward)")
    _check_tensors(files.shapes, out)
    backbone = backbone_from_header(files.shapes, PREFIX[detect(files.shapes)], preset, given)
    if "lm_width" in out and out["lm_width"][0] != backbone["lm_width"][0]:
        raise WeightsError(f"{out['lm_width'][1]} is {out['lm_width'][0]}, but {backbone['lm_width'][1]} is "
                           f"{backbone['lm_width'][0]}")
    return {**out, **backbone}


def base_config(files: WeightsFiles) -> Mapping[str, Any]:
    """The N1.7 config.json of a LeRobot `GrootPolicy` folder ("type": "groot"), which names its
    model's shapes only through its base model: trainkit's export's n17/ beside it, else
    `base_model_path` when that is a local folder."""
    base = files.config.get("base_model_path")
    for folder in (Path(files.folder) / "n17", Path(str(base))):
        if files.folder and (folder / "config.json").is_file():
            try:
                doc = json.loads((folder / "config.json").read_text())
            except (OSError, ValueError) as e:
                raise WeightsError(f"{folder}/config.json, its base model's config, is unreadable ({str(e)[:120]})",
                                   "config.json") from None
            if isinstance(doc, dict):
                return doc
    raise WeightsError(f"a LeRobot GrootPolicy folder whose base model ({base}) has no local config.json (trainkit "
                       "reads the model's shapes there); download it and set base_model_path to its folder",
                       "config.json")


def _check_tensors(shapes: Mapping[str, tuple[int, ...]], out: Fixed) -> None:
    """config.json's values against the per-embodiment tensors' and the block counts'."""
    prefix = PREFIX[detect(shapes)]
    checks = ((H + "state_encoder.layer1.W", {0: "embodiments", 1: "state_dim", 2: "head_hidden"}),
              (H + "action_encoder.W1.W", {0: "embodiments", 1: "action_dim", 2: "dit_width"}),
              (H + "action_decoder.layer2.W", {2: "action_dim"}))
    for key, dims in checks:
        shape = shapes.get(prefix + key)
        if shape is None:
            raise WeightsError(f"missing key {prefix + key!r} (the model's shape is checked against it)")
        for dim, name in dims.items():
            if name in out and (len(shape) != 3 or shape[dim] != out[name][0]):
                raise WeightsError(f"{out[name][1]} is {out[name][0]}, but tensor {prefix + key!r} has shape "
                                   f"{list(shape)}")
    for name, start in (("dit_depth", DIT + "transformer_blocks."), ("vl_layers", VL)):
        found = {int(m.group(1)) for k in shapes if (m := re.match(re.escape(prefix + start) + r"(\d+)\.", k))}
        if name in out and len(found) != out[name][0]:
            raise WeightsError(f"{out[name][1]} is {out[name][0]}, but the checkpoint holds {len(found)} blocks "
                               f"under {prefix + start!r}")


def _count(config: Mapping[str, Any], key: str, zero: bool = False) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
        raise WeightsError(f"{key} is {value!r}, not a {'non-negative' if zero else 'positive'} integer", "config.json")
    return value


def _probability(config: Mapping[str, Any], key: str) -> float:
    value = config[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise WeightsError(f"{key} is {value!r}, not a probability in [0, 1)", "config.json")
    return float(value)


def n17_config(cfg: Gr00tConfig) -> dict[str, Any]:
    """The head's part of Isaac-GR00T's / LeRobot's `GR00TN17Config` at this model's shapes (what
    config.json holds and `config_from_weights` reads back)."""
    return {"backbone_embedding_dim": cfg.lm_width, "select_layer": cfg.lm_depth, "tune_top_llm_layers": cfg.lm_trained,
            "max_state_dim": cfg.state_dim, "max_action_dim": cfg.action_dim, "action_horizon": cfg.horizon,
            "hidden_size": cfg.head_hidden, "input_embedding_dim": cfg.dit_width, "state_history_length": 1,
            "add_pos_embed": True, "max_seq_len": cfg.max_positions, "use_vlln": True, "use_alternate_vl_dit": True,
            "attend_text_every_n_blocks": 2, "state_dropout_prob": cfg.state_dropout,
            "max_num_embodiments": cfg.embodiments, "noise_beta_alpha": 1.5, "noise_beta_beta": 1.0, "noise_s": 0.999,
            "num_timestep_buckets": cfg.time_buckets, "num_inference_timesteps": 4,
            "vl_self_attention_cfg": {"positional_embeddings": None, "num_layers": cfg.vl_layers,
                                      "num_attention_heads": cfg.vl_heads, "attention_head_dim": cfg.vl_head_dim,
                                      "dropout": cfg.dropout, "final_dropout": True},
            "diffusion_model_cfg": {"positional_embeddings": None, "num_layers": cfg.dit_depth,
                                    "num_attention_heads": cfg.dit_heads,
                                    "attention_head_dim": cfg.dit_width // cfg.dit_heads, "norm_type": "ada_norm",
                                    "dropout": cfg.dropout, "final_dropout": True, "output_dim": cfg.head_hidden,
                                    "interleave_self_attention": True}}


COSMOS = "nvidia/Cosmos-Reason2-2B"  # the backbone N1.7's config.json names (LeRobot builds its shapes from the name)


def config_json(cfg: Gr00tConfig, features: Mapping[str, Any]) -> dict[str, Any]:
    """An export's config.json: Isaac-GR00T's / LeRobot's `GR00TN17Config` (model_type "Gr00tN1d7")
    at this model's shapes, which `GR00TN17.from_pretrained` reads and `config_from_weights` reads
    back. The backbone is named, not described (as in the published checkpoint): LeRobot builds
    Cosmos-Reason2-2B's shapes for it, so only a model of those shapes loads there. `features` (the
    robot's cameras and sizes) are LeRobot's processor's business, not this file's; the view size and
    crop are the model's."""
    return {"model_type": "Gr00tN1d7", "architectures": ["GR00TN17"], "model_name": COSMOS,
            "backbone_model_type": "qwen", "tune_llm": False, "tune_visual": False,
            "image_target_size": [cfg.image_height, cfg.image_width], **crop_config(cfg), **n17_config(cfg)}


def crop_config(cfg: Gr00tConfig) -> dict[str, Any]:
    """The processor's crop fields of `GR00TN17Config` for the model's view transform at evaluation
    (its defaults claim N1.7's 230 / 256 crop, also for a run that cropped nothing)."""
    crop = eval_crop(cfg)
    return {"image_crop_size": list(crop) if crop else None, "crop_fraction": N17_CROP_FRACTION if crop else None}

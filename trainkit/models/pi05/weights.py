"""The `pi05` family's mapping to the checkpoints users have: LeRobot's `PI05Policy` and openpi's
PyTorch converter (`lerobot/pi05_base`), both ways; and the processor pipeline LeRobot serves a
PI05Policy with (`lerobot_processors`, written into an export by trainkit/weights/lerobot_processors.py).

Layouts (detected from the keys of `model.safetensors`):
- "lerobot": `save_pretrained`'s keys, prefixed `model.` (`model.paligemma_with_expert...`);
- "openpi": the same names without the prefix, as `lerobot/pi05_base` and openpi's converter write
  them; `pi05_base` has no `embed_tokens` (the embedding is read from the tied `lm_head`).
What the mapping does (each checked against LeRobot 0.6.1 by tests/trainkit/models/pi05/test_pi05_lerobot_parity.py):
- q/k/v and gate/up are fused here (`qkv`, `gate_up`), separate there: rows concatenated;
- Gemma's RMSNorm stores `w` and applies `x * (1 + w)`; trainkit's weight is `1 + w`;
- the action expert's adaRMS (`dense` -> scale, shift, gate per norm): there the residual is
  `x + y * gate`, here `x + y * (1 + gate)` (pi05/mot.py), so the gate bias rows shift by 1, and
  the two norms' modulations are one `ada` linear here (attention then MLP);
- not read by the flow loss, so absent here and dropped on load: the final norm's gate rows and the
  backbone's final norm, the last LM layer's prefix q/o/post-norm/MLP (pi05/mot.py), both
  `lm_head`s. An export writes them as the neutral values (zeros: a Gemma norm of scale 1) so
  that LeRobot's strict `from_pretrained` loads the file; they never change an action.
The model's shape is read from a checkpoint too (`config_from_weights`, for `model.init_from`:
trainkit/weights/shape.py): widths, depths and heads from the tensors' shapes, the rest from config.json;
and its tokenizer from the folder (`weights_tokenizer`: an export's tokenizer/, openpi's assets),
a real-width checkpoint without one refused unless the run names one.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from trainkit.errors import ConfigError, WeightsError
from trainkit.models.family import Fixed, WeightsFiles
from trainkit.models.pi05.config import Pi05Config
from trainkit.models.pi05.tokenizer import sentencepiece_file

FORMATS = ("lerobot", "openpi")
PREFIX = {"lerobot": "model.", "openpi": ""}
_PG = "paligemma_with_expert.paligemma."
V = _PG + "model.vision_tower.vision_model."
L = _PG + "model.language_model."
E = "paligemma_with_expert.gemma_expert.model."
LM_HEAD = _PG + "lm_head.weight"
EXPERT_HEAD = "paligemma_with_expert.gemma_expert.lm_head.weight"
EMBED = L + "embed_tokens.weight"


@dataclass(frozen=True)
class Rule:
    """One trainkit parameter from checkpoint tensors (names without the format's prefix).
    op "cat": the sources' rows concatenated; "norm": 1 + w; "ada": the sources (3 x width rows
    each: scale, shift, gate) concatenated, each gate row minus 1; "head": the first 2 x width
    rows (scale, shift) of one adaRMS `dense`."""

    target: str
    sources: tuple[str, ...]
    op: Literal["cat", "norm", "ada", "head"] = "cat"
    width: int = 0  # "ada" / "head": the expert's width (rows of one modulation)
    rows: tuple[int, ...] = ()  # several sources: the rows of each (to split them again on export)

    def gather(self, tensors: list[torch.Tensor], *, gradient: bool = False) -> torch.Tensor:
        """The trainkit tensor from the sources' tensors. `gradient`: map gradients instead (no
        offsets: d/dw is the same for w and 1 + w)."""
        x = torch.cat(tensors, dim=0) if len(tensors) > 1 else tensors[0]
        if self.op == "norm":
            return x if gradient else 1 + x
        if self.op == "head":
            return x[: 2 * self.width]
        if self.op == "ada" and not gradient:
            x = x.clone()
            for i in range(len(tensors)):
                x[(3 * i + 2) * self.width: (3 * i + 3) * self.width] -= 1
        return x

    def scatter(self, value: torch.Tensor) -> dict[str, torch.Tensor]:
        """The sources' tensors from the trainkit tensor (the export)."""
        if self.op == "norm":
            return {self.sources[0]: value - 1}
        if self.op == "head":  # the final norm's gate is never read: written as 0
            return {self.sources[0]: torch.cat([value, value.new_zeros((self.width, *value.shape[1:]))])}
        parts = dict(zip(self.sources, value.split(list(self.rows), dim=0) if self.rows else [value]))
        if self.op == "ada":
            for s, part in parts.items():
                part = parts[s] = part.clone()
                part[2 * self.width:] += 1
        return parts


def _vision_rules(cfg: Pi05Config) -> list[Rule]:
    e = V + "embeddings."
    rules = [Rule("patch_embed.weight", (e + "patch_embedding.weight",)),
             Rule("patch_embed.bias", (e + "patch_embedding.bias",)),
             Rule("vision_pos", (e + "position_embedding.weight",))]
    for i in range(cfg.vision_depth):
        src, dst = f"{V}encoder.layers.{i}.", f"vision_blocks.{i}."
        for w in ("weight", "bias"):
            rules += [Rule(dst + f"norm1.{w}", (src + f"layer_norm1.{w}",)),
                      Rule(dst + f"qkv.{w}", tuple(src + f"self_attn.{p}_proj.{w}" for p in "qkv"),
                           rows=(cfg.vision_width,) * 3),
                      Rule(dst + f"out.{w}", (src + f"self_attn.out_proj.{w}",)),
                      Rule(dst + f"norm2.{w}", (src + f"layer_norm2.{w}",)),
                      Rule(dst + f"fc1.{w}", (src + f"mlp.fc1.{w}",)),
                      Rule(dst + f"fc2.{w}", (src + f"mlp.fc2.{w}",))]
    for w in ("weight", "bias"):
        rules += [Rule(f"vision_norm.{w}", (V + f"post_layernorm.{w}",)),
                  Rule(f"projector.{w}", (_PG + f"model.multi_modal_projector.linear.{w}",))]
    return rules


def _layer_rules(cfg: Pi05Config, i: int) -> list[Rule]:
    lm, ex, dst = f"{L}layers.{i}.", f"{E}layers.{i}.", f"lm_layers.{i}."
    last = i == cfg.lm_depth - 1
    q, kv = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim
    qkv = {"k": kv, "v": kv} if last else {"q": q, "k": kv, "v": kv}  # the last prefix half: K/V only
    rules = [Rule(dst + "lm.norm_attn.weight", (lm + "input_layernorm.weight",), "norm"),
             Rule(dst + "lm.qkv.weight", tuple(lm + f"self_attn.{p}_proj.weight" for p in qkv),
                  rows=tuple(qkv.values()))]
    if not last:
        rules += [Rule(dst + "lm.out.weight", (lm + "self_attn.o_proj.weight",)),
                  Rule(dst + "lm.norm_mlp.weight", (lm + "post_attention_layernorm.weight",), "norm"),
                  Rule(dst + "lm.mlp.gate_up.weight", (lm + "mlp.gate_proj.weight", lm + "mlp.up_proj.weight"),
                       rows=(cfg.lm_mlp,) * 2),
                  Rule(dst + "lm.mlp.down.weight", (lm + "mlp.down_proj.weight",))]
    norms = (ex + "input_layernorm.dense.", ex + "post_attention_layernorm.dense.")  # attention, then MLP
    w = cfg.expert_width
    return rules + [
        Rule(dst + "expert.qkv.weight", tuple(ex + f"self_attn.{p}_proj.weight" for p in "qkv"), rows=(q, kv, kv)),
        Rule(dst + "expert.out.weight", (ex + "self_attn.o_proj.weight",)),
        Rule(dst + "expert.ada.weight", tuple(n + "weight" for n in norms), rows=(3 * w, 3 * w)),
        Rule(dst + "expert.ada.bias", tuple(n + "bias" for n in norms), "ada", w, rows=(3 * w, 3 * w)),
        Rule(dst + "expert.mlp.gate_up.weight", (ex + "mlp.gate_proj.weight", ex + "mlp.up_proj.weight"),
             rows=(cfg.expert_mlp,) * 2),
        Rule(dst + "expert.mlp.down.weight", (ex + "mlp.down_proj.weight",))]


def rules(cfg: Pi05Config, embed_from: str = EMBED) -> list[Rule]:
    """Every trainkit parameter's rule; `embed_from`: the key the text embedding is read from."""
    out = _vision_rules(cfg) + [Rule("embed.weight", (embed_from,))]
    for name, src in (("action_in", "action_in_proj"), ("time_in", "time_mlp_in"), ("time_out", "time_mlp_out"),
                      ("action_out", "action_out_proj")):
        out += [Rule(f"{name}.weight", (f"{src}.weight",)), Rule(f"{name}.bias", (f"{src}.bias",))]
    for i in range(cfg.lm_depth):
        out += _layer_rules(cfg, i)
    return out + [Rule("final_ada.weight", (E + "norm.dense.weight",), "head", cfg.expert_width),
                  Rule("final_ada.bias", (E + "norm.dense.bias",), "head", cfg.expert_width)]


def detect(keys: Collection[str]) -> str:
    """The format of a `model.safetensors` with these keys; WeightsError naming a key if neither."""
    if any(k.startswith("model.paligemma_with_expert.") for k in keys):
        return "lerobot"
    if any(k.startswith("paligemma_with_expert.") for k in keys):
        return "openpi"
    first = min(keys, default="(none)")
    raise WeightsError(f"unknown checkpoint format: no key starts with 'model.paligemma_with_expert.' (LeRobot) "
                       f"or 'paligemma_with_expert.' (openpi / pi05_base); first key {first!r}")


def read_plan(cfg: Pi05Config, keys: Collection[str]) -> tuple[str, list[Rule]]:
    """(format, rules with full key names) for a checkpoint holding `keys`."""
    fmt = detect(keys)
    prefix = PREFIX[fmt]
    embed = EMBED if prefix + EMBED in keys else LM_HEAD  # pi05_base: no embed_tokens, the tied lm_head
    return fmt, [replace(r, sources=tuple(prefix + s for s in r.sources)) for r in rules(cfg, embed)]


def _neutral(cfg: Pi05Config) -> dict[str, tuple[int, ...]]:
    """Shapes of the tensors LeRobot holds that trainkit never reads, written as zeros on export."""
    last = f"{L}layers.{cfg.lm_depth - 1}."
    return {EXPERT_HEAD: (cfg.vocab, cfg.expert_width), L + "norm.weight": (cfg.lm_width,),
            last + "self_attn.q_proj.weight": (cfg.heads_q * cfg.head_dim, cfg.lm_width),
            last + "self_attn.o_proj.weight": (cfg.lm_width, cfg.heads_q * cfg.head_dim),
            last + "post_attention_layernorm.weight": (cfg.lm_width,),
            last + "mlp.gate_proj.weight": (cfg.lm_mlp, cfg.lm_width),
            last + "mlp.up_proj.weight": (cfg.lm_mlp, cfg.lm_width),
            last + "mlp.down_proj.weight": (cfg.lm_width, cfg.lm_mlp)}


def export_tensors(cfg: Pi05Config, state: Mapping[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of format `fmt` ("lerobot" | "openpi") from trainkit's state dict (views
    of it where a tensor is split, and lm_head is the embedding itself, tied as in PaliGemma)."""
    if fmt not in FORMATS:
        raise WeightsError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    out: dict[str, torch.Tensor] = {}
    for rule in rules(cfg):
        out.update(rule.scatter(state[rule.target]))
    for key, shape in _neutral(cfg).items():
        out[key] = state["embed.weight"].new_zeros(shape)
    out[LM_HEAD] = out[EMBED]
    if fmt == "openpi":  # pi05_base: the embedding only as the tied lm_head
        del out[EMBED]
    prefix = PREFIX[fmt]
    return {prefix + k: v for k, v in out.items()}


def policy_config(cfg: Pi05Config, features: Mapping[str, Any]) -> dict[str, Any]:
    """LeRobot's `config.json` (PI05Config) for an export: `features` has "cameras" (names),
    "state_dim" and "action_dim" of the robot. The Gemma variants are the two LeRobot knows; a
    non-full preset is written with them too (LeRobot can only build the full widths)."""
    size = [3, cfg.image_size, cfg.image_size]
    inputs = {cam: {"type": "VISUAL", "shape": size} for cam in features["cameras"]}
    inputs["observation.state"] = {"type": "STATE", "shape": [int(features["state_dim"])]}
    return {"type": "pi05", "n_obs_steps": 1, "input_features": inputs,
            "output_features": {"action": {"type": "ACTION", "shape": [int(features["action_dim"])]}},
            "device": "cpu", "use_amp": False, "push_to_hub": False, "paligemma_variant": "gemma_2b",
            "action_expert_variant": "gemma_300m", "dtype": "float32", "chunk_size": cfg.horizon,
            "n_action_steps": cfg.horizon, "max_state_dim": cfg.max_state_dim, "max_action_dim": cfg.action_dim,
            "image_resolution": [cfg.image_size, cfg.image_size], "tokenizer_max_length": cfg.text_len,
            "min_period": 4e-3, "max_period": 4.0}


# --- the model's shape from a checkpoint (model.init_from) ------------------------------------------
# the variants config.json names -> (width, head size), as LeRobot 0.6.1's `get_gemma_config` and
# openpi's `gemma.get_config` build them (both 8 query heads, 1 KV head)
GEMMA = {"gemma_2b": (2048, 256), "gemma_300m": (1024, 256)}
SO400M = (1152, 16)  # PaliGemma's SigLIP So400m/14: (width, heads), hard-coded in LeRobot and openpi
META_HEAD_DIM, META_VISION_HEADS = "trainkit.head_dim", "trainkit.vision_heads"
CONFIG = "config.json"
# config.json keys -> Pi05Config fields: LeRobot's PI05Config ("type": "pi05"), openpi's converter
LEROBOT_KEYS = {"chunk_size": "horizon", "tokenizer_max_length": "text_len", "max_state_dim": "max_state_dim"}
OPENPI_KEYS = {"action_horizon": "horizon", "max_token_len": "text_len"}


def shape_metadata(cfg: Pi05Config) -> dict[str, str]:
    """model.safetensors' __metadata__ on export: the head counts its tensors cannot say (LeRobot
    ignores it; its config.json refuses keys it does not know)."""
    return {META_HEAD_DIM: str(cfg.head_dim), META_VISION_HEADS: str(cfg.vision_heads)}


def config_from_weights(files: WeightsFiles, preset: Pi05Config, given: Mapping[str, Any]) -> Fixed:
    """Every Pi05Config field the checkpoint fixes, with where it is read: widths, depths, vocab,
    patch and image size, action channels from the tensors' shapes; the head counts from the
    projections and a head size (`_head_dim`); chunk length, prompt length and max state channels
    from config.json. `preset` and `given` (the run's model.* settings) only answer what a
    checkpoint cannot: the head sizes of a model no config.json names."""
    prefix = PREFIX[detect(files.shapes)]

    def shape(key: str, ndim: int) -> tuple[int, ...]:
        got = files.shapes.get(prefix + key)
        if got is None:
            raise WeightsError(f"missing key {prefix + key!r} (the model's shape is read from it)")
        if len(got) != ndim:
            raise WeightsError(f"tensor {prefix + key!r} has shape {list(got)}; expected {ndim} dimensions")
        return got

    def at(key: str, what: str) -> str:
        return f"model.safetensors {prefix + key!r} {what}"

    out: Fixed = {}
    patch_w = V + "embeddings.patch_embedding.weight"
    width, channels, ph, pw = shape(patch_w, 4)
    if channels != 3 or ph != pw:
        raise WeightsError(f"tensor {prefix + patch_w!r} has shape {[width, channels, ph, pw]}; expected "
                           "[width, 3, patch, patch]")
    out["vision_width"], out["patch"] = (width, at(patch_w, "rows")), (ph, at(patch_w, "kernel"))
    pos = V + "embeddings.position_embedding.weight"
    tokens, side = shape(pos, 2)[0], math.isqrt(shape(pos, 2)[0])
    if side * side != tokens:
        raise WeightsError(f"tensor {prefix + pos!r} has {tokens} positions, not a square grid of patches")
    out["image_size"] = (side * ph, at(pos, f"rows {tokens} = ({side} patches of {ph} px)^2"))
    out["vision_depth"] = (_depth(files.shapes, prefix + V + "encoder.layers."),
                           f"model.safetensors {V}encoder.layers.*")
    fc1 = f"{V}encoder.layers.0.mlp.fc1.weight"
    out["vision_mlp"] = (shape(fc1, 2)[0], at(fc1, "rows"))
    embed = EMBED if prefix + EMBED in files.shapes else LM_HEAD  # pi05_base: the tied lm_head only
    vocab, lm_width = shape(embed, 2)
    out["vocab"], out["lm_width"] = (vocab, at(embed, "rows")), (lm_width, at(embed, "columns"))
    depth, expert_depth = (_depth(files.shapes, prefix + L + "layers."), _depth(files.shapes, prefix + E + "layers."))
    if depth != expert_depth:
        raise WeightsError(f"the backbone has {depth} layers and the action expert {expert_depth}: a Pi0.5 pairs them")
    out["lm_depth"] = (depth, f"model.safetensors {L}layers.*")
    gate, expert_gate = L + "layers.0.mlp.gate_proj.weight", E + "layers.0.mlp.gate_proj.weight"
    out["lm_mlp"] = (shape(gate, 2)[0], at(gate, "rows"))
    out["expert_mlp"], out["expert_width"] = (shape(expert_gate, 2)[0], at(expert_gate, "rows")), \
        (shape(expert_gate, 2)[1], at(expert_gate, "columns"))
    action_in = "action_in_proj.weight"
    out["action_dim"] = (shape(action_in, 2)[1], at(action_in, "columns"))
    out.update(_heads(files, prefix, shape, at, preset, given, lm_width, expert_width=out["expert_width"][0]))
    out.update(_vision_heads(files, preset, given, width))
    out.update(_from_config_json(files.config, out))
    out.update(weights_tokenizer(files, given, vocab))
    return out


# where a checkpoint folder carries its SentencePiece model, in the order looked: a trainkit export's
# tokenizer/, a bare file beside the weights, openpi's assets/<asset id>/
TOKENIZER_PLACES = ("tokenizer/tokenizer.model", "tokenizer.model", "assets/*/tokenizer.model")
PALIGEMMA_VOCAB = 257_152  # PaliGemma's vocabulary: an embedding of these rows was trained on its tokenizer


def weights_tokenizer(files: WeightsFiles, given: Mapping[str, Any], vocab: int) -> Fixed:
    """model.tokenizer from the checkpoint folder when the run names none: the first of
    TOKENIZER_PLACES it holds. None there and a PaliGemma-sized embedding (real weights, trained on
    PaliGemma's prompts): refused, naming the file to pass; `model.tokenizer = "builtin"` opts in
    to trainkit's own. A tiny checkpoint without one keeps the preset's."""
    if "tokenizer" in given or not files.folder:
        return {}
    folder = Path(files.folder)
    for place in TOKENIZER_PLACES:
        found = sorted(p for p in folder.glob(place) if p.is_file())
        if found:
            return {"tokenizer": (str(found[0].resolve()), f"model.init_from's {found[0].relative_to(folder)}")}
    if vocab == PALIGEMMA_VOCAB:
        raise ConfigError("model.tokenizer", f"model.init_from {folder} carries no tokenizer (none of "
                          f"{', '.join(TOKENIZER_PLACES)}) and its {vocab}-row embedding is PaliGemma's: pass the "
                          "tokenizer.model it was trained with, --set model.tokenizer=PATH/tokenizer.model (PaliGemma's: "
                          "google/paligemma-3b-pt-224 on the Hub, openpi's gs://big_vision/paligemma_tokenizer.model), "
                          "or --set model.tokenizer=builtin to train with trainkit's own prompt tokenizer on purpose")
    return {}


def _depth(shapes: Collection[str], start: str) -> int:
    """Blocks under `start` (`...layers.<i>.`): the highest index + 1 (a gap is the plan's missing key)."""
    found = [int(m.group(1)) for k in shapes if (m := re.match(re.escape(start) + r"(\d+)\.", k))]
    if not found:
        raise WeightsError(f"no key starts with {start!r}: no blocks to count")
    return max(found) + 1


def _heads(files: WeightsFiles, prefix: str, shape: Callable[[str, int], tuple[int, ...]],
           at: Callable[[str, str], str], preset: Pi05Config, given: Mapping[str, Any], lm_width: int,
           expert_width: int) -> Fixed:
    """heads_q, heads_kv and head_dim: the q/k projections' rows over a head size (`_head_dim`);
    both experts must agree (they attend jointly)."""
    q_key, k_key = L + "layers.0.self_attn.q_proj.weight", L + "layers.0.self_attn.k_proj.weight"
    q, kv = shape(q_key, 2)[0], shape(k_key, 2)[0]
    eq_key = E + "layers.0.self_attn.q_proj.weight"
    if shape(eq_key, 2)[0] != q:
        raise WeightsError(f"tensor {prefix + eq_key!r} has {shape(eq_key, 2)[0]} rows, the backbone's q_proj {q}: "
                           "both experts need the same query heads")
    head_dim, why = _head_dim(files, preset, given, lm_width, expert_width)
    if q % head_dim or kv % head_dim:
        raise WeightsError(f"q_proj rows {q} and k_proj rows {kv} are not multiples of head_dim {head_dim} ({why})")
    return {"head_dim": (head_dim, why),
            "heads_q": (q // head_dim, at(q_key, f"rows {q} / head_dim {head_dim}")),
            "heads_kv": (kv // head_dim, at(k_key, f"rows {kv} / head_dim {head_dim}"))}


def _head_dim(files: WeightsFiles, preset: Pi05Config, given: Mapping[str, Any], lm_width: int,
              expert_width: int) -> tuple[int, str]:
    """The head size, which no tensor shape holds (q_proj rows = heads x head size), from the first
    that says it: trainkit's export (the file's metadata); config.json's Gemma variant when its width
    is the checkpoint's (LeRobot and openpi build only gemma_2b / gemma_300m: 8 x 256 query, 1 x 256
    KV); the run's model.head_dim; the preset's when its widths are the checkpoint's. Otherwise
    refused: guessing would build a model of other attention that still loads every tensor."""
    if META_HEAD_DIM in files.metadata:
        return _meta_int(files.metadata, META_HEAD_DIM), f"model.safetensors __metadata__ {META_HEAD_DIM}"
    for key, width in (("paligemma_variant", lm_width), ("action_expert_variant", expert_width)):
        name = files.config.get(key)
        variant = GEMMA.get(name) if isinstance(name, str) else None
        if variant is not None and variant[0] == width:
            return variant[1], f"config.json {key} {name!r} (Gemma: head_dim {variant[1]})"
    if "head_dim" in given:
        if not isinstance(given["head_dim"], int) or isinstance(given["head_dim"], bool) or given["head_dim"] <= 0:
            raise WeightsError(f"model.head_dim is {given['head_dim']!r}, not a positive integer")
        return given["head_dim"], "model.head_dim as set"
    if (preset.lm_width, preset.expert_width) == (lm_width, expert_width):
        return preset.head_dim, "the preset's, whose lm_width and expert_width are the checkpoint's"
    raise WeightsError(f"cannot tell head_dim: the tensors hold heads x head_dim, config.json names no Gemma variant "
                       f"of width {lm_width}, and the preset's widths ({preset.lm_width}, {preset.expert_width}) are "
                       f"not the checkpoint's ({lm_width}, {expert_width}); set model.head_dim"
                       + _fitting_presets(lambda c: (c.lm_width, c.expert_width) == (lm_width, expert_width), preset))


def _fitting_presets(fits: Callable[[Pi05Config], bool], preset: Pi05Config) -> str:
    """", or model.preset=NAME, whose widths are the checkpoint's" for the other presets that `fits`:
    what a refusal offers beside the one field (a tiny export fine-tuned with pi05_finetune's `full`)."""
    from trainkit.models.pi05.config import PRESETS

    names = [name for name, make in PRESETS.items() if make() != preset and fits(make())]
    if not names:
        return ""
    more = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
    return f", or model.preset={names[0]}{more}, whose widths are the checkpoint's"


def _vision_heads(files: WeightsFiles, preset: Pi05Config, given: Mapping[str, Any], width: int) -> Fixed:
    """SigLIP's head count (its q/k/v are width x width at any count), by `_head_dim`'s order:
    trainkit's metadata, So400m's 16 at width 1152, the run's setting, the preset's at its width."""
    if META_VISION_HEADS in files.metadata:
        return {"vision_heads": (_meta_int(files.metadata, META_VISION_HEADS),
                                 f"model.safetensors __metadata__ {META_VISION_HEADS}")}
    if width == SO400M[0]:
        return {"vision_heads": (SO400M[1], f"SigLIP So400m (vision width {width}): {SO400M[1]} heads")}
    if "vision_heads" in given:
        return {"vision_heads": (given["vision_heads"], "model.vision_heads as set")}
    if preset.vision_width == width:
        return {"vision_heads": (preset.vision_heads, "the preset's, whose vision_width is the checkpoint's")}
    raise WeightsError(f"cannot tell vision_heads: the vision width {width} is not So400m's {SO400M[0]} nor the "
                       f"preset's {preset.vision_width}; set model.vision_heads"
                       + _fitting_presets(lambda c: c.vision_width == width, preset))


def _meta_int(metadata: Mapping[str, str], key: str) -> int:
    try:
        value = int(metadata[key])
    except ValueError:
        value = 0
    if value <= 0:
        raise WeightsError(f"__metadata__ {key} is {metadata[key]!r}, not a positive integer")
    return value


def _from_config_json(config: Mapping[str, Any], tensors: Fixed) -> Fixed:
    """Chunk length, prompt length, max state channels from config.json (LeRobot's or openpi's
    keys), and its action channels and image size checked against the tensors'."""
    if "type" in config and config["type"] != "pi05":
        raise WeightsError(f"type {config['type']!r}: not a Pi0.5 policy (LeRobot writes 'pi05')", CONFIG)
    keys = LEROBOT_KEYS if config.get("type") == "pi05" else OPENPI_KEYS
    out: Fixed = {}
    for key, name in keys.items():
        if key in config:
            out[name] = (_positive(config, key), f"config.json {key}")
    checks = {"max_action_dim": "action_dim", "action_dim": "action_dim"}
    for key, name in checks.items():
        if key in config and _positive(config, key) != tensors[name][0]:
            raise WeightsError(f"{key} {config[key]} differs from the tensors' {tensors[name][0]} "
                               f"({tensors[name][1]})", CONFIG)
    if "image_resolution" in config:
        res = config["image_resolution"]
        size = tensors["image_size"][0]
        if not (isinstance(res, list) and len(res) == 2 and res[0] == res[1] == size):
            raise WeightsError(f"image_resolution {res} differs from the tensors' {size} x {size} "
                               f"({tensors['image_size'][1]})", CONFIG)
    return out


def _positive(config: Mapping[str, Any], key: str) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise WeightsError(f"{key} is {value!r}, not a positive integer", CONFIG)
    return value


PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"  # the Hub tokenizer LeRobot's pi05 pipeline names
LEROBOT_STATE_BINS = 256  # Pi05PrepareStateTokenizerProcessorStep's bins (np.linspace(-1, 1, 257)), fixed there


def lerobot_processors(cfg: Pi05Config, policy: Mapping[str, Any],
                       tokenizer_name: str | None) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """(the step entries of `policy_preprocessor.json` and `policy_postprocessor.json`, what in
    them differs from this model's training). The steps are those LeRobot 0.6.1's
    `make_pi05_pre_post_processors` builds for `policy` (the export's config.json), as its
    `save_pretrained` writes them: rename, batch, relative actions (off), normalise, the state
    discretised into the prompt (after the normaliser: it bins values in [-1, 1]), the tokenizer
    step (`tokenizer_name`, None: LeRobot's PaliGemma from the Hub) at this model's prompt length,
    padded right, then the device; after the model, unnormalise, absolute actions (off), the CPU.
    The two normaliser steps carry only their registry name: trainkit/weights/lerobot_processors.py
    writes their features, modes and statistics. LeRobot's prompt is openpi's (pi05/tokenizer.py PaligemmaPromptTokenizer); a model
    trained with another (the built-in tokenizer, another bin count) gets these steps and a note."""
    device = {"registry_name": "device_processor", "config": {"device": policy.get("device") or "cpu",
                                                              "float_dtype": None}}
    tokenizer_name = tokenizer_name or PALIGEMMA_TOKENIZER
    tokenizer = {"max_length": cfg.text_len, "task_key": "task", "padding_side": "right", "padding": "max_length",
                 "truncation": True, "tokenizer_name": tokenizer_name}
    pre = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
           {"registry_name": "to_batch_processor", "config": {}},
           {"registry_name": "relative_actions_processor",
            "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}},
           {"registry_name": "normalizer_processor"},
           {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
           {"registry_name": "tokenizer_processor", "config": tokenizer},
           device]
    post = [{"registry_name": "unnormalizer_processor"},
            {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]
    notes = []
    if sentencepiece_file(cfg.tokenizer) is None:
        notes.append("the run trained with trainkit's built-in prompt tokenizer (no model.tokenizer), which LeRobot "
                     f"does not have: its tokenizer step ({tokenizer_name}) builds other prompts than the ones "
                     "this policy learned; train with model.tokenizer=PaliGemma's tokenizer.model to serve it")
    if cfg.state_bins != LEROBOT_STATE_BINS:
        notes.append(f"the run discretised the state into {cfg.state_bins} bins; LeRobot's pi05 prompt uses "
                     f"{LEROBOT_STATE_BINS}, so its prompts differ from the ones this policy learned")
    return {"policy_preprocessor": pre, "policy_postprocessor": post}, notes

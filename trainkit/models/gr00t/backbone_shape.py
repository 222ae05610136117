"""The Qwen3-VL backbone's shape from a GR00T N1.7 checkpoint's safetensors header (`model.init_from`).

config.json describes the head (weights.py `config_from_weights`) but names the backbone only
("nvidia/Cosmos-Reason2-2B"): LeRobot builds that model's shapes from the name. A checkpoint saved at
other backbone sizes (a tiny test model, a fine-tune of another Qwen3-VL) therefore says its shapes
in its tensors alone, as Pi0.5's does (trainkit/models/pi05/weights.py), and they are read here
without reading any tensor's data:
- ViT: `visual.patch_embed.proj.weight` (width, 3, temporal patch, patch, patch), the learned position
  table `visual.pos_embed.weight` (rows: a square grid), blocks `visual.blocks.*` and their MLP
  (`mlp.linear_fc1` rows), the merge (`visual.merger.linear_fc1`: width x merge^2 square), the
  deepstack mergers' count;
- LLM: vocabulary and width (`language_model.embed_tokens`), MLP (`mlp.gate_proj` rows), the head size
  (qk RMSNorm's `q_norm` length) and so both head counts (q_proj / k_proj rows over it).
What no tensor holds: the ViT's head count (its qkv is 3 x width at any count) and which blocks feed
the deepstack mergers. They come from the run's `model.*` setting, else the preset's where its
widths are the checkpoint's (Cosmos-Reason2's 16 heads at width 1024), else the run is refused in
one line naming the field to set: guessing would build other attention that still loads every tensor.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from trainkit.errors import WeightsError
from trainkit.models.family import Fixed
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.qwen3_vl.backbone import BACKBONE_PREFIX

COSMOS_VISION = (1024, 16)  # Cosmos-Reason2-2B's ViT: width, heads (LeRobot's hard-coded config)


def backbone_from_header(shapes: Mapping[str, tuple[int, ...]], prefix: str, preset: Gr00tConfig,
                         given: Mapping[str, Any]) -> Fixed:
    """Every backbone field of Gr00tConfig the tensors fix (module docstring), with where each was
    read; `prefix`: the format's ("" Isaac-GR00T, "_groot_model." LeRobot)."""
    base = prefix + BACKBONE_PREFIX

    def shape(name: str, ndim: int) -> tuple[int, ...]:
        got = shapes.get(base + name)
        if got is None:
            raise WeightsError(f"missing key {base + name!r} (the backbone's shape is read from it)")
        if len(got) != ndim:
            raise WeightsError(f"tensor {base + name!r} has shape {list(got)}; expected {ndim} dimensions")
        return tuple(got)

    def at(name: str, what: str) -> str:
        return f"model.safetensors {base + name!r} {what}"

    out: Fixed = {}
    patch_key = "visual.patch_embed.proj.weight"
    width, channels, tp, ph, pw = shape(patch_key, 5)
    if channels != 3 or ph != pw:
        raise WeightsError(f"tensor {base + patch_key!r} has shape {[width, channels, tp, ph, pw]}; expected "
                           "[width, 3, temporal patch, patch, patch]")
    out["vision_width"] = (width, at(patch_key, "rows"))
    out["temporal_patch"] = (tp, at(patch_key, "dim 2"))
    out["patch"] = (ph, at(patch_key, "kernel"))
    pos_key = "visual.pos_embed.weight"
    table = shape(pos_key, 2)[0]
    if math.isqrt(table) ** 2 != table:
        raise WeightsError(f"tensor {base + pos_key!r} has {table} positions, not a square grid")
    out["position_table"] = (table, at(pos_key, "rows"))
    depth = _count(shapes, base + "visual.blocks.")
    out["vision_depth"] = (depth, f"model.safetensors {base}visual.blocks.*")
    fc1 = "visual.blocks.0.mlp.linear_fc1.weight"
    out["vision_mlp"] = (shape(fc1, 2)[0], at(fc1, "rows"))
    merger = "visual.merger.linear_fc1.weight"
    merged = shape(merger, 2)[0]
    merge = math.isqrt(merged // width)
    if merge * merge * width != merged:
        raise WeightsError(f"tensor {base + merger!r} has {merged} rows, not the vision width {width} x merge^2")
    out["merge"] = (merge, at(merger, f"rows {merged} = {width} x {merge}^2"))
    embed = "language_model.embed_tokens.weight"
    vocab, lm_width = shape(embed, 2)
    out["vocab"], out["lm_width"] = (vocab, at(embed, "rows")), (lm_width, at(embed, "columns"))
    layer = "language_model.layers.0."
    out["lm_mlp"] = (shape(layer + "mlp.gate_proj.weight", 2)[0], at(layer + "mlp.gate_proj.weight", "rows"))
    head_dim = shape(layer + "self_attn.q_norm.weight", 1)[0]
    q, kv = shape(layer + "self_attn.q_proj.weight", 2)[0], shape(layer + "self_attn.k_proj.weight", 2)[0]
    if q % head_dim or kv % head_dim:
        raise WeightsError(f"q_proj rows {q} and k_proj rows {kv} are not multiples of the head size {head_dim} "
                           f"(q_norm's length, {base + layer}self_attn.q_norm.weight)")
    out["head_dim"] = (head_dim, at(layer + "self_attn.q_norm.weight", "length"))
    out["heads_q"] = (q // head_dim, at(layer + "self_attn.q_proj.weight", f"rows {q} / head_dim {head_dim}"))
    out["heads_kv"] = (kv // head_dim, at(layer + "self_attn.k_proj.weight", f"rows {kv} / head_dim {head_dim}"))
    out.update(_vision_heads(preset, given, width))
    out.update(_deepstack(shapes, base, preset, given, depth))
    return out


def _count(shapes: Mapping[str, tuple[int, ...]], start: str) -> int:
    """Blocks under `start` (`...<i>.`): the highest index + 1 (a gap is the load's missing key)."""
    found = [int(m.group(1)) for k in shapes if (m := re.match(re.escape(start) + r"(\d+)\.", k))]
    if not found:
        raise WeightsError(f"no key starts with {start!r}: no blocks to count")
    return max(found) + 1


def _vision_heads(preset: Gr00tConfig, given: Mapping[str, Any], width: int) -> Fixed:
    """The ViT's head count, which no tensor shape holds: the run's, the preset's at its width,
    Cosmos-Reason2's at 1024, else refused."""
    if "vision_heads" in given:
        return {"vision_heads": (given["vision_heads"], "model.vision_heads as set")}
    if preset.vision_width == width:
        return {"vision_heads": (preset.vision_heads, "the preset's, whose vision_width is the checkpoint's")}
    if width == COSMOS_VISION[0]:
        return {"vision_heads": (COSMOS_VISION[1], f"Cosmos-Reason2's ViT (width {width}): {COSMOS_VISION[1]} heads")}
    raise WeightsError(f"cannot tell vision_heads: the ViT width {width} is neither the preset's "
                       f"{preset.vision_width} nor Cosmos-Reason2's {COSMOS_VISION[0]}; set model.vision_heads")


def _deepstack(shapes: Mapping[str, tuple[int, ...]], base: str, preset: Gr00tConfig, given: Mapping[str, Any],
               depth: int) -> Fixed:
    """The ViT blocks that feed the deepstack mergers: the checkpoint holds as many mergers as there
    are such blocks, not which ones. The run's setting, else the preset's when it has that many
    blocks within the checkpoint's depth, else refused."""
    start = base + "visual.deepstack_merger_list."
    count = _count(shapes, start) if any(k.startswith(start) for k in shapes) else 0
    if "deepstack" in given:  # the run's own value, as it set it (the contradiction check compares it)
        if len(given["deepstack"]) != count:
            raise WeightsError(f"model.deepstack names {len(given['deepstack'])} blocks; the checkpoint holds {count} "
                               f"deepstack mergers ({start}*)")
        return {"deepstack": (given["deepstack"], "model.deepstack as set")}
    if len(preset.deepstack) == count and all(i < depth for i in preset.deepstack):
        return {"deepstack": (preset.deepstack, f"the preset's, as many blocks as the checkpoint's {count} mergers")}
    raise WeightsError(f"cannot tell which ViT blocks feed the checkpoint's {count} deepstack mergers (the preset's "
                       f"{list(preset.deepstack)} do not fit its {depth} blocks); set model.deepstack")

"""The tensors LeRobot 0.6.1's `GrootPolicy` builds for a `gr00t` export, key by key (the LeRobot
side of trainkit/weights/servable.py; pi05/lerobot_shapes.py is Pi0.5's).

    build = lerobot_build(cfg, policy, files)   # LeRobotBuild: shapes, the setting behind each, patch note

How LeRobot builds it (lerobot/policies/groot/groot_n1_7.py and lerobot/policies/groot/action_head/cross_attention_dit.py,
computed here without them): `GrootPolicy` builds `GR00TN17` from the export's n17/config.json
(every key below is prefixed `_groot_model.`):
- the backbone: Qwen3-VL from `_cosmos_reason2_qwen3_vl_config()`, a hard-coded copy of
  Cosmos-Reason2-2B's config (`COSMOS`), whatever n17/config.json says, its LLM cut to the config's
  `select_layer` layers; the LM head is tied to the embedding and not saved;
- the action head from n17/config.json: per-embodiment state encoder, action encoder and decoder
  (`max_num_embodiments` slots), the VL LayerNorm and self-attention blocks
  (`vl_self_attention_cfg`), the action position table (`max_seq_len`), the DiT
  (`diffusion_model_cfg`: AdaLayerNorm blocks, even blocks cross-attending the backbone's
  `backbone_embedding_dim` channels, odd ones self-attending when `interleave_self_attention`).
A model whose backbone is not Cosmos-Reason2-2B's (the tiny presets) is built by LeRobot only with
`_cosmos_reason2_qwen3_vl_config` patched to return its Qwen3-VL config (as
tools/lerobot_oracle/groot_serve_oracle.py does); `patch_note` says so for README.txt.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trainkit.models.family import LeRobotBuild
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.lerobot_policy import BASE_DIR

P = "_groot_model."
VIS = P + "backbone.model.model.visual."
LM = P + "backbone.model.model.language_model."
HEAD = P + "action_head."
# _cosmos_reason2_qwen3_vl_config(): the backbone LeRobot builds, as Gr00tConfig fields
COSMOS = {"vision_width": 1024, "vision_depth": 24, "vision_mlp": 4096, "vision_heads": 16, "patch": 16,
          "temporal_patch": 2, "merge": 2, "position_table": 2304, "deepstack": (5, 11, 17), "lm_width": 2048,
          "lm_mlp": 6144, "heads_q": 16, "heads_kv": 8, "head_dim": 128, "vocab": 151_936}
COSMOS_LAYERS = 28  # its LLM's num_hidden_layers, before GR00T cuts them to select_layer
# diffusers-style defaults of the DiT and SelfAttentionTransformer where the config is silent
DIT_DEFAULTS = {"num_attention_heads": 8, "attention_head_dim": 64, "output_dim": 26, "num_layers": 12,
                "norm_type": "ada_norm", "interleave_self_attention": False}


def _backbone(b: Mapping[str, Any], layers: int, put: Any) -> None:
    """Qwen3-VL's vision tower and the first `layers` LLM layers at the widths `b`."""
    vw, m2 = b["vision_width"], b["vision_width"] * b["merge"] ** 2
    put(VIS + "patch_embed.proj.weight", (vw, 3, b["temporal_patch"], b["patch"], b["patch"]), "model.patch")
    put(VIS + "patch_embed.proj.bias", (vw,))
    put(VIS + "pos_embed.weight", (b["position_table"], vw), "model.position_table")
    for i in range(b["vision_depth"]):
        k = f"{VIS}blocks.{i}."
        for name, shape in (("norm1", (vw,)), ("norm2", (vw,)), ("attn.qkv", (3 * vw, vw)), ("attn.proj", (vw, vw)),
                            ("mlp.linear_fc1", (b["vision_mlp"], vw)), ("mlp.linear_fc2", (vw, b["vision_mlp"]))):
            put(f"{k}{name}.weight", shape)
            put(f"{k}{name}.bias", (shape[0],))
    mergers = [("merger.", vw)] + [(f"deepstack_merger_list.{j}.", m2) for j in range(len(b["deepstack"]))]
    for name, norm in mergers:  # the deepstack mergers normalise after the shuffle, the last one before
        for part, shape in (("norm", (norm,)), ("linear_fc1", (m2, m2)), ("linear_fc2", (b["lm_width"], m2))):
            put(f"{VIS}{name}{part}.weight", shape)
            put(f"{VIS}{name}{part}.bias", (shape[0],))
    w, hd = b["lm_width"], b["head_dim"]
    put(LM + "embed_tokens.weight", (b["vocab"], w), "model.vocab")
    for i in range(layers):
        k = f"{LM}layers.{i}."
        for name, shape in (("self_attn.q_proj", (b["heads_q"] * hd, w)), ("self_attn.k_proj", (b["heads_kv"] * hd, w)),
                            ("self_attn.v_proj", (b["heads_kv"] * hd, w)), ("self_attn.o_proj", (w, b["heads_q"] * hd)),
                            ("self_attn.q_norm", (hd,)), ("self_attn.k_norm", (hd,)),
                            ("mlp.gate_proj", (b["lm_mlp"], w)), ("mlp.up_proj", (b["lm_mlp"], w)),
                            ("mlp.down_proj", (w, b["lm_mlp"])), ("input_layernorm", (w,)),
                            ("post_attention_layernorm", (w,))):
            put(f"{k}{name}.weight", shape)
    put(LM + "norm.weight", (w,))


def _blocks(prefix: str, n: int, inner: int, cross: list[int | None], ada: bool, affine: bool, put: Any) -> None:
    """diffusers-style BasicTransformerBlocks: norm1 (AdaLayerNorm's linear, or a LayerNorm), attn1
    (keys and values from `cross[i]` channels, or its own), norm3 (when affine), a GELU feed-forward x4."""
    for i in range(n):
        k = f"{prefix}transformer_blocks.{i}."
        if ada:
            put(k + "norm1.linear.weight", (2 * inner, inner))
            put(k + "norm1.linear.bias", (2 * inner,))
        elif affine:
            put(k + "norm1.weight", (inner,))
            put(k + "norm1.bias", (inner,))
        kv = cross[i] or inner
        for name, shape in (("attn1.to_q", (inner, inner)), ("attn1.to_k", (inner, kv)), ("attn1.to_v", (inner, kv)),
                            ("attn1.to_out.0", (inner, inner))):
            put(f"{k}{name}.weight", shape)
            put(f"{k}{name}.bias", (inner,))
        if affine:
            put(k + "norm3.weight", (inner,))
            put(k + "norm3.bias", (inner,))
        put(k + "ff.net.0.proj.weight", (4 * inner, inner))
        put(k + "ff.net.0.proj.bias", (4 * inner,))
        put(k + "ff.net.2.weight", (inner, 4 * inner))
        put(k + "ff.net.2.bias", (inner,))


def _head(n17: Mapping[str, Any], put: Any) -> None:
    e, h, d = n17["max_num_embodiments"], n17["hidden_size"], n17["input_embedding_dim"]
    s, a, bb = n17["max_state_dim"] * n17.get("state_history_length", 1), n17["max_action_dim"], n17["backbone_embedding_dim"]
    slots = "model.embodiments (config.json max_num_embodiments)"
    for name, (i, o) in (("state_encoder.layer1", (s, h)), ("state_encoder.layer2", (h, d)),
                         ("action_encoder.W1", (a, d)), ("action_encoder.W2", (2 * d, d)), ("action_encoder.W3", (d, d)),
                         ("action_decoder.layer1", (h, h)), ("action_decoder.layer2", (h, a))):
        put(f"{HEAD}{name}.W", (e, i, o), slots)
        put(f"{HEAD}{name}.b", (e, o), slots)
    if n17.get("use_vlln", True):
        put(HEAD + "vlln.weight", (bb,))
        put(HEAD + "vlln.bias", (bb,))
    vl = dict(n17.get("vl_self_attention_cfg") or {})
    if vl.get("num_layers", 0) > 0:
        inner = vl.get("num_attention_heads", 8) * vl.get("attention_head_dim", 64)
        _blocks(HEAD + "vl_self_attention.", vl["num_layers"], inner, [None] * vl["num_layers"], False, True, put)
    if n17.get("add_pos_embed", True):
        put(HEAD + "position_embedding.weight", (n17["max_seq_len"], d), "model.max_positions (config.json max_seq_len)")
    dit = {**DIT_DEFAULTS, **(n17.get("diffusion_model_cfg") or {})}
    inner, n = dit["num_attention_heads"] * dit["attention_head_dim"], dit["num_layers"]
    m = HEAD + "model."
    put(m + "timestep_encoder.timestep_embedder.linear_1.weight", (inner, 256))
    put(m + "timestep_encoder.timestep_embedder.linear_1.bias", (inner,))
    put(m + "timestep_encoder.timestep_embedder.linear_2.weight", (inner, inner))
    put(m + "timestep_encoder.timestep_embedder.linear_2.bias", (inner,))
    cross = [None if i % 2 == 1 and dit["interleave_self_attention"] else bb for i in range(n)]
    _blocks(m, n, inner, cross, dit["norm_type"] == "ada_norm", False, put)
    put(m + "proj_out_1.weight", (2 * inner, inner))
    put(m + "proj_out_1.bias", (2 * inner,))
    put(m + "proj_out_2.weight", (dit["output_dim"], inner))
    put(m + "proj_out_2.bias", (dit["output_dim"],))


def lerobot_build(cfg: Gr00tConfig, policy: Mapping[str, Any], files: Mapping[str, bytes]) -> LeRobotBuild:
    """GrootPolicy's state dict for an export of `cfg` (its saved keys: the tied LM head left out),
    from the N1.7 config.json of its base folder among the export's `files` (n17/config.json);
    `policy` (GrootPolicy's config.json) names nothing that changes a shape."""
    n17 = json.loads(files[f"{BASE_DIR}/config.json"])
    shapes: dict[str, tuple[int, ...]] = {}
    settings: dict[str, str] = {}

    def put(key: str, shape: tuple[int, ...], setting: str = "") -> None:
        shapes[key], settings[key] = tuple(shape), setting

    model = {k: tuple(v) if isinstance(v := getattr(cfg, k), (list, tuple)) else v for k in COSMOS}
    patched = [k for k in COSMOS if model[k] != COSMOS[k]]
    layers = min(int(n17.get("select_layer", cfg.lm_depth)), cfg.lm_depth if patched else COSMOS_LAYERS)
    _backbone(model if patched else COSMOS, layers, put)
    _head(n17, put)
    note = ""
    if patched:
        given = ", ".join(f"{k} {model[k]}" for k in patched)
        note = ("LeRobot 0.6.1 builds this model only patched: GrootPolicy builds the backbone from a hard-coded copy "
                f"of Cosmos-Reason2-2B's config, and this model has {given}. Before GrootPolicy.from_pretrained, make "
                "lerobot.policies.groot.groot_n1_7._cosmos_reason2_qwen3_vl_config return this model's Qwen3-VL "
                "config (and call _register_with_transformers()), as trainkit's "
                "tools/lerobot_oracle/groot_serve_oracle.py does; unpatched, LeRobot reports missing and unexpected "
                "keys and serves the backbone's random weights")
    return LeRobotBuild(shapes=shapes, settings=settings, patch_note=note)

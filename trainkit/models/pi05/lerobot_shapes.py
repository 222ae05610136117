"""The tensors LeRobot 0.6.1's `PI05Policy` builds from an export's config.json, key by key: what
`trainkit export --format lerobot` must write for `PI05Policy.from_pretrained` to load every weight.

    build = lerobot_build(cfg, policy)   # LeRobotBuild: shapes, the setting behind each, patch note

Why: LeRobot's `from_pretrained` does not fail on a size mismatch; it prints "Warning: Could not load
state dict ... size mismatch" and returns the randomly initialised policy, whose actions are finite
and wrong. trainkit/weights/servable.py refuses such an export before it is written.

How LeRobot builds the model (lerobot/policies/pi05/modeling_pi05.py, computed here without it):
- `get_gemma_config(variant)`: config.json's `paligemma_variant` / `action_expert_variant`, only
  "gemma_2b" (2048 wide, 18 deep, MLP 16384) and "gemma_300m" (1024, 18, 4096), both 8 query heads
  and 1 KV head of 256 channels;
- `PaliGemmaWithExpertModel.__init__`: one vocabulary, 257,152 rows, for the backbone's embedding
  and lm_head and for the expert's lm_head; SigLIP at Hugging Face's PaliGemma defaults (1152 wide,
  27 deep, patch 14; MLP 4304); the image side from config.json's `image_resolution`;
- `PI05Pytorch`: the action and time projections from `max_action_dim` and the expert's width;
- `compute_layer_complete` reshapes the attention output to `8 * head_dim`: no config and no patch
  of the two functions above serves another number of query heads.
A model of other widths (the tiny presets) is built by LeRobot only with `get_gemma_config` and
`PaliGemmaWithExpertModel.__init__` patched to its widths (tools/lerobot_oracle/pi05_oracle.py
`patch_tiny` does it for the tests); its shapes are then the model's own, still with 8 query heads
and one vocabulary. `patch_note` says so for README.txt. Checked against LeRobot's own full-size
state dict by tests/trainkit/weights/test_export_servable.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainkit.models.family import LeRobotBuild
from trainkit.models.pi05.config import Pi05Config

# get_gemma_config's variants: (width, depth, mlp, kv heads, head_dim); 8 query heads each
VARIANTS = {"gemma_2b": (2048, 18, 16_384, 1, 256), "gemma_300m": (1024, 18, 4096, 1, 256)}
VOCAB = 257_152
# SigLIP So400m: its heads decide no shape, but a patch building other widths must set them too
SIGLIP = {"vision_width": 1152, "vision_depth": 27, "vision_mlp": 4304, "vision_heads": 16, "patch": 14}
QUERY_HEADS = 8  # compute_layer_complete's reshape: fixed in LeRobot's code
PG = "model.paligemma_with_expert.paligemma."
V = PG + "model.vision_tower.vision_model."
L = PG + "model.language_model."
E = "model.paligemma_with_expert.gemma_expert."


def _widths(cfg: Pi05Config, policy: Mapping[str, Any]) -> tuple[dict[str, int], list[str]]:
    """The widths LeRobot builds (stock from config.json's variants, else the model's where a patch
    must put them) and the fields that need the patch."""
    lm = VARIANTS.get(policy.get("paligemma_variant"), (0, 0, 0, 0, 0))
    ex = VARIANTS.get(policy.get("action_expert_variant"), (0, 0, 0, 0, 0))
    stock = {"lm_width": lm[0], "lm_depth": lm[1], "lm_mlp": lm[2], "heads_kv": lm[3], "head_dim": lm[4],
             "expert_width": ex[0], "expert_depth": ex[1], "expert_mlp": ex[2], "vocab": VOCAB, **SIGLIP}
    model = {**{k: getattr(cfg, k) for k in stock if k != "expert_depth"}, "expert_depth": cfg.lm_depth}
    patched = [k for k in stock if stock[k] != model[k]]
    return {k: model[k] for k in stock}, patched


def lerobot_build(cfg: Pi05Config, policy: Mapping[str, Any], files: Mapping[str, bytes] = {}) -> LeRobotBuild:
    """LeRobot 0.6.1's PI05Policy state dict for the export's config.json `policy` (key -> shape, in
    its module order), the model setting that decides each shape, and the patch LeRobot needs
    (`files`, the export's other files, decide nothing here)."""
    w, patched = _widths(cfg, policy)
    side = int(policy.get("image_resolution", [cfg.image_size])[0])
    actions = int(policy.get("max_action_dim", cfg.action_dim))
    q, kv, mlp = QUERY_HEADS * w["head_dim"], w["heads_kv"] * w["head_dim"], w["vision_mlp"]
    shapes: dict[str, tuple[int, ...]] = {}
    settings: dict[str, str] = {}

    def put(key: str, shape: tuple[int, ...], setting: str = "") -> None:
        shapes[key], settings[key] = shape, setting

    vw = w["vision_width"]
    put(PG + "lm_head.weight", (w["vocab"], w["lm_width"]), "model.vocab")
    put(V + "embeddings.patch_embedding.weight", (vw, 3, w["patch"], w["patch"]))
    put(V + "embeddings.patch_embedding.bias", (vw,))
    put(V + "embeddings.position_embedding.weight", ((side // w["patch"]) ** 2, vw),
        "model.image_size (config.json image_resolution)")
    for i in range(w["vision_depth"]):
        b = f"{V}encoder.layers.{i}."
        for name, shape in (("layer_norm1", (vw,)), ("self_attn.k_proj", (vw, vw)), ("self_attn.v_proj", (vw, vw)),
                            ("self_attn.q_proj", (vw, vw)), ("self_attn.out_proj", (vw, vw)), ("layer_norm2", (vw,)),
                            ("mlp.fc1", (mlp, vw)), ("mlp.fc2", (vw, mlp))):
            put(f"{b}{name}.weight", shape)
            put(f"{b}{name}.bias", (shape[0],))
    put(V + "post_layernorm.weight", (vw,))
    put(V + "post_layernorm.bias", (vw,))
    put(PG + "model.multi_modal_projector.linear.weight", (w["lm_width"], vw))
    put(PG + "model.multi_modal_projector.linear.bias", (w["lm_width"],))
    put(L + "embed_tokens.weight", (w["vocab"], w["lm_width"]), "model.vocab")
    heads = f"model.heads_q={QUERY_HEADS} (LeRobot's attention takes {QUERY_HEADS} query heads of head_dim, whatever its config)"
    for prefix, width, mlp_dim, depth in ((L, w["lm_width"], w["lm_mlp"], w["lm_depth"]),
                                          (E + "model.", w["expert_width"], w["expert_mlp"], w["expert_depth"])):
        for i in range(depth):
            b = f"{prefix}layers.{i}."
            put(b + "self_attn.q_proj.weight", (q, width), heads)
            put(b + "self_attn.k_proj.weight", (kv, width), "model.heads_kv")
            put(b + "self_attn.v_proj.weight", (kv, width), "model.heads_kv")
            put(b + "self_attn.o_proj.weight", (width, q), heads)
            put(b + "mlp.gate_proj.weight", (mlp_dim, width))
            put(b + "mlp.up_proj.weight", (mlp_dim, width))
            put(b + "mlp.down_proj.weight", (width, mlp_dim))
            if prefix == L:
                put(b + "input_layernorm.weight", (width,))
                put(b + "post_attention_layernorm.weight", (width,))
            else:  # the expert's adaRMS: scale, shift, gate per norm
                for norm in ("input_layernorm", "post_attention_layernorm"):
                    put(f"{b}{norm}.dense.weight", (3 * width, width))
                    put(f"{b}{norm}.dense.bias", (3 * width,))
    put(L + "norm.weight", (w["lm_width"],))
    ew = w["expert_width"]
    put(E + "lm_head.weight", (w["vocab"], ew), "model.vocab (LeRobot builds the expert's lm_head with the backbone's vocabulary)")
    put(E + "model.norm.dense.weight", (3 * ew, ew))
    put(E + "model.norm.dense.bias", (3 * ew,))
    action = "model.action_dim (config.json max_action_dim)"
    put("model.action_in_proj.weight", (ew, actions), action)
    put("model.action_in_proj.bias", (ew,))
    put("model.action_out_proj.weight", (actions, ew), action)
    put("model.action_out_proj.bias", (actions,), action)
    for name in ("time_mlp_in", "time_mlp_out"):
        put(f"model.{name}.weight", (ew, ew))
        put(f"model.{name}.bias", (ew,))
    note = ""
    if patched:
        given = ", ".join(f"{k} {w[k]}" for k in patched)
        note = (f"LeRobot 0.6.1 builds this model only patched: config.json names {policy.get('paligemma_variant')} / "
                f"{policy.get('action_expert_variant')}, whose widths (and SigLIP So400m's, vocabulary {VOCAB}) "
                f"LeRobot hard-codes, and this model has {given}. Before PI05Policy.from_pretrained, replace "
                "lerobot.policies.pi05.modeling_pi05.get_gemma_config and PaliGemmaWithExpertModel.__init__ with "
                "ones building these widths (8 query heads stay), as trainkit's "
                "tools/lerobot_oracle/pi05_oracle.py patch_tiny does; unpatched, LeRobot warns of size mismatches "
                "and serves random weights")
    return LeRobotBuild(shapes=shapes, settings=settings, patch_note=note)

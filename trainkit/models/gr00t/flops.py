"""The analytic cost of one `gr00t` sample, as a function of the image slots its batch carries:
FLOPs (frozen parts forward only, trained parts forward + backward), token counts, and the
activations autograd saves (inspect's memory estimate). `tests/trainkit/models/gr00t/test_gr00t.py` checks the FLOPs
against torch.utils.flop_counter on `tiny`; with LoRA (`model.lora_rank`) the count is what runs
(`lora_flops`), checked the same way in tests/trainkit/models/test_lora_flops.py.
"""
from __future__ import annotations

from trainkit.errors import ModelConfigError
from trainkit.models.family import Activations
from trainkit.models.gr00t.action_head import TIME_FEATURES, block_context
from trainkit.models.gr00t.config import Gr00tConfig


def tokens_per_sample(cfg: Gr00tConfig, n_slots: int) -> dict[str, int]:
    """Token counts of one sample with `n_slots` image slots: vision patches, VL tokens (image +
    text, through the LLM), action-head tokens (state + actions); "sequence" = VL + action head."""
    vl = n_slots * (cfg.tokens_per_image + 2) + cfg.text_len  # each view between <|vision_start|> and <|vision_end|>
    return {"vision": n_slots * cfg.patches_per_image, "vl": vl, "action": 1 + cfg.horizon,
            "sequence": vl + 1 + cfg.horizon}


def lm_layer_flops(cfg: Gr00tConfig, t: int) -> int:
    """Forward FLOPs of one LLM layer over t tokens (attention over all t x t: the masked kernel computes them)."""
    qkv = (cfg.heads_q + 2 * cfg.heads_kv) * cfg.head_dim
    qd = cfg.heads_q * cfg.head_dim
    return 2 * t * (cfg.lm_width * qkv + qd * cfg.lm_width + 3 * cfg.lm_width * cfg.lm_mlp) + 4 * t * t * qd


def frozen_forward(cfg: Gr00tConfig, n_slots: int) -> int:
    """Forward FLOPs of the frozen parts: the ViT (its patch embedding is one frame's: the temporal
    kernel is summed), the merger and the deepstack mergers, the lower LLM layers."""
    p, d, t = cfg.patches_per_image, cfg.vision_width, cfg.tokens_per_image
    tower = (2 * p * 3 * cfg.patch ** 2 * d
             + cfg.vision_depth * (2 * p * (4 * d * d + 2 * d * cfg.vision_mlp) + 4 * p * p * d))
    merged = cfg.merge ** 2 * d
    connector = (1 + len(cfg.deepstack)) * 2 * t * (merged * merged + merged * cfg.lm_width)
    vl = tokens_per_sample(cfg, n_slots)["vl"]
    return n_slots * (tower + connector) + cfg.lm_frozen * lm_layer_flops(cfg, vl)


def trained_forward(cfg: Gr00tConfig, n_slots: int) -> int:
    """Forward FLOPs of the trained parts: top LLM layers, the VL self-attention (over every VL
    token, padding included: it takes no mask but a missing camera's) and the action head."""
    vl = tokens_per_sample(cfg, n_slots)["vl"]
    s, dw, ff, hh, h = 1 + cfg.horizon, cfg.dit_width, cfg.dit_ff, cfg.head_hidden, cfg.horizon
    contexts = {"text": cfg.text_len + 2 * n_slots, "image": n_slots * cfg.tokens_per_image}  # model.split_context
    dit = 0
    for i in range(cfg.dit_depth):
        kind = block_context(i)
        dit += 2 * dw * 2 * dw + 2 * s * dw * dw + 2 * s * 2 * dw * ff  # AdaLayerNorm, O, feed-forward
        if kind == "self":
            dit += 2 * s * dw * 3 * dw + 4 * s * s * dw
        else:
            c = contexts[kind]
            dit += 2 * s * dw * dw + 2 * c * cfg.lm_width * 2 * dw + 4 * s * c * dw
    lw, t = cfg.lm_width, vl
    vl_blocks = cfg.vl_layers * (2 * t * (3 * lw * lw + lw * lw + 2 * 4 * lw * lw) + 4 * t * t * lw)
    head = (2 * (TIME_FEATURES * dw + dw * dw)                                   # time MLP
            + 2 * (cfg.state_dim * hh + hh * dw)                                 # state encoder
            + 2 * h * (cfg.action_dim * dw + 2 * dw * dw + dw * dw)              # action encoder
            + 2 * dw * 2 * dw + 2 * s * dw * hh                                  # output AdaLN + projection
            + 2 * s * (hh * hh + hh * cfg.action_dim))                           # decoder (every token)
    return cfg.lm_trained * lm_layer_flops(cfg, vl) + vl_blocks + dit + head


def no_input_grad(cfg: Gr00tConfig) -> int:
    """FLOPs of the input gradients backward never computes: the first matmul of the time MLP, the
    state encoder and the action encoder reads data (features, state, x_t), not activations."""
    return (2 * TIME_FEATURES * cfg.dit_width + 2 * cfg.state_dim * cfg.head_hidden
            + 2 * cfg.horizon * cfg.action_dim * cfg.dit_width)


def flops_per_sample(cfg: Gr00tConfig, n_slots: int) -> float:
    """Model FLOPs of one sample: frozen parts 1x their forward (no backward), trained parts 3x
    (forward + backward: a matmul's backward is two), less the input gradients of the three
    matmuls that read data (no_input_grad); no recompute. Every matmul (2 FLOPs per multiply-add)
    and attention's QK^T and AV; not norms, activations, RoPE, softmax or embedding lookups."""
    if not 1 <= n_slots <= cfg.max_slots:
        raise ModelConfigError(f"n_slots {n_slots} is outside 1..max_slots={cfg.max_slots}")
    if cfg.lora_rank:
        return lora_flops(cfg, n_slots)
    return float(frozen_forward(cfg, n_slots) + 3 * trained_forward(cfg, n_slots) - no_input_grad(cfg))


def cached_flops_per_sample(cfg: Gr00tConfig, n_slots: int) -> float:
    """`flops_per_sample` of a run on a cached backbone (cache.py): the frozen ViT and LLM layers
    ran offline, so their forward is not this step's work."""
    return flops_per_sample(cfg, n_slots) - frozen_forward(cfg, n_slots)


def _linear(tokens: int, i: int, o: int, grad_in: bool, r: int = 0, parts: tuple[int, ...] = ()) -> int:
    """A frozen linear's forward (and input gradient when its input needs one), plus rank-r adapters on
    output rows `parts` (one A over them: forward, weight gradient, input gradient when needed; each
    B: forward, weight and input gradients)."""
    base = (1 + grad_in) * 2 * tokens * i * o
    if not parts:
        return base
    return base + (2 + grad_in) * 2 * tokens * i * r * len(parts) + 3 * 2 * tokens * r * sum(parts)


def _attention(pairs: int, d: int, q: bool, k: bool, v: bool) -> int:
    """Forward QK^T and AV; backward dQ, dK (when q / k need gradients), dA (when q or k does), dV."""
    unit = 2 * pairs * d
    return 2 * unit + unit * (q + k + (q or k) + v)


def lora_flops(cfg: Gr00tConfig, n_slots: int) -> float:
    """FLOPs of one sample's forward + backward with LoRA on `cfg.lora_targets` (VL self-attention and
    DiT), everything else frozen: the backbone, time, state and action encoders see no gradient
    (forward only); the rest runs forward and input gradients from the first adapter on, weight
    gradients only in the adapters."""
    r, tg = cfg.lora_rank, set(cfg.lora_targets)
    vl = tokens_per_sample(cfg, n_slots)["vl"]
    s, dw, ff, hh, h, lw = 1 + cfg.horizon, cfg.dit_width, cfg.dit_ff, cfg.head_hidden, cfg.horizon, cfg.lm_width
    total = (frozen_forward(cfg, n_slots) + cfg.lm_trained * lm_layer_flops(cfg, vl)
             + 2 * (TIME_FEATURES * dw + dw * dw) + 2 * (cfg.state_dim * hh + hh * dw)
             + 2 * h * (cfg.action_dim * dw + 2 * dw * dw + dw * dw))

    def attention_block(x: bool, tokens: int, width: int, kv_tokens: int, kv_width: int, ctx: bool | None) -> tuple[int, bool]:
        """(FLOPs, output needs a gradient) of q, k, v, attention and O of one block; ctx None: self-attention."""
        if ctx is None:
            parts = tuple(width for n in ("to_q", "to_k", "to_v") if n in tg)
            f = _linear(tokens, width, 3 * width, x, r, parts)
            # q, k and v are views of one output: any part adapted, all need a gradient
            q = k = v = x or any(n in tg for n in ("to_q", "to_k", "to_v"))
        else:
            f = _linear(tokens, width, width, x, r, (width,) if "to_q" in tg else ())
            f += _linear(kv_tokens, kv_width, 2 * width, ctx, r, tuple(width for n in ("to_k", "to_v") if n in tg))
            q, k = x or "to_q" in tg, ctx or "to_k" in tg or "to_v" in tg
            v = k
        f += _attention(tokens * (kv_tokens if ctx is not None else tokens), width, q, k, v)
        a = q or k or v
        f += _linear(tokens, width, width, a, r, (width,) if "to_out" in tg else ())
        return f, x or a or "to_out" in tg

    x = False
    for _ in range(cfg.vl_layers):
        f, x = attention_block(x, vl, lw, vl, lw, None)
        total += f + _linear(vl, lw, 4 * lw, x) + _linear(vl, 4 * lw, lw, x)
    ctx, x = x, False
    contexts = {"text": cfg.text_len + 2 * n_slots, "image": n_slots * cfg.tokens_per_image}
    for i in range(cfg.dit_depth):
        kind = block_context(i)
        total += 2 * dw * 2 * dw  # AdaLayerNorm's linear on the time embedding (no gradient)
        if kind == "self":
            f, x = attention_block(x, s, dw, s, dw, None)
        else:
            f, x = attention_block(x, s, dw, contexts[kind], lw, ctx)
        total += f + _linear(s, dw, ff, x) + _linear(s, ff, dw, x)
    total += 2 * dw * 2 * dw + _linear(s, dw, hh, x) + _linear(s, hh, hh, x) + _linear(s, hh, cfg.action_dim, x)
    return float(total)


def activations(cfg: Gr00tConfig, n_slots: int) -> Activations:
    """Saved-for-backward elements of ONE sample, eager. Frozen blocks run under no_grad: nothing.
    A trained LLM layer per token: norm input and output, q, k, v (after norm and RoPE, repeated
    K/V), attention output, residual and its norm output, gate/up (2 x mlp), SiLU and product
    (2 x mlp). A DiT block per token: its input, the modulated norm, q, k, v, attention output,
    residual, norm output (8 x width), feed-forward input and GELU output (2 x ff); a cross block
    keeps its context's K and V instead of its own. A VL self-attention block per token: the DiT's
    set at the LLM width (8 x width, 2 x its 4 x width feed-forward). Dropout masks are not counted."""
    vl = tokens_per_sample(cfg, n_slots)["vl"]
    s, dw = 1 + cfg.horizon, cfg.dit_width
    qd = cfg.heads_q * cfg.head_dim
    lm = (vl * (6 * cfg.lm_width + 4 * qd + 4 * cfg.lm_mlp), vl * cfg.lm_width)
    contexts = {"text": cfg.text_len + 2 * n_slots, "image": n_slots * cfg.tokens_per_image, "self": 0}
    dit = [(s * (8 * dw + 2 * cfg.dit_ff) + 2 * contexts[block_context(i)] * dw, s * dw) for i in range(cfg.dit_depth)]
    vl_block = (vl * (8 * cfg.lm_width + 2 * 4 * cfg.lm_width), vl * cfg.lm_width)
    return Activations(blocks={"vision_blocks": [(0, 0)] * cfg.vision_depth, "lm_frozen": [(0, 0)] * cfg.lm_frozen,
                               "lm_layers": [lm] * cfg.lm_trained, "vl_blocks": [vl_block] * cfg.vl_layers,
                               "dit_blocks": dit},
                       root=n_slots * 3 * cfg.image_height * cfg.image_width)

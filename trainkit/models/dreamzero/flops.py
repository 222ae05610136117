"""The analytic cost of one `dreamzero` sample: FLOPs (forward + backward), token counts, and the
activations autograd saves (inspect's memory estimate). Counts every matmul (2 FLOPs per
multiply-add) and attention's QK^T and AV over the pairs the block-causal pattern computes
(sequence.py: 30% of full attention's at 5b), not norms, modulation, RoPE or activations. The whole
DiT trains (3x its forward); the features come from the cache (no encoder runs).
`tests/trainkit/models/dreamzero/test_dreamzero.py` checks it against torch.utils.flop_counter on `tiny`.
With LoRA (`model.lora_rank`) the count is what runs (`lora_flops`): no weight gradient of a frozen
weight, no input gradient where nothing before it trains; tests/trainkit/models/test_lora_flops.py checks it against
torch.utils.flop_counter on `tiny`, docs/fine-tuning.md states it.
The image-slot argument of the contract does not change anything here: the three views are one
canvas (datakit's tiling), whatever the batch carries.
"""
from __future__ import annotations

from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.sequence import TokenSequence
from trainkit.models.family import Activations


def tokens_per_sample(cfg: DreamZeroConfig, n_slots: int = 3) -> dict[str, int]:
    """Token counts of one sample: DiT sequence parts and the cross-attention context."""
    video = cfg.latent_frames * cfg.tokens_per_frame
    return {"video_clean": video, "video_noisy": video, "actions": cfg.horizon, "state": cfg.state_tokens,
            "context": cfg.context_tokens, "sequence": TokenSequence.of(cfg).total}


def block_forward(cfg: DreamZeroConfig) -> float:
    """Forward FLOPs of one DiT block over one sample."""
    d, seq = cfg.dim, TokenSequence.of(cfg)
    t, c = seq.total, cfg.context_tokens
    linear = 2 * t * (4 * d * d + 2 * d * d + 2 * d * cfg.ffn)  # self q, k, v, o; cross q, o; FFN
    context_kv = 2 * c * 2 * d * d  # cross k, v over the text; k_img, v_img over the image
    return float(linear + context_kv + 4 * seq.attended_pairs * d + 4 * t * c * d)


def root_forward(cfg: DreamZeroConfig) -> float:
    """Forward FLOPs outside the blocks: embeddings, time, head, the action/state MLPs."""
    d, video = cfg.dim, cfg.latent_frames * cfg.tokens_per_frame
    segments = cfg.blocks + 2  # flow-time segments: clean, noisy frame 0, one per block
    patch = 2 * 2 * video * cfg.in_dim * cfg.patch[1] * cfg.patch[2] * d  # clean and noisy
    text = 2 * cfg.text_len * (cfg.text_width * d + d * d)
    image = 2 * cfg.image_tokens * (cfg.image_width ** 2 + cfg.image_width * d)
    time = 2 * segments * (cfg.freq_dim * d + d * d + 6 * d * d)
    head = 2 * video * d * cfg.patch_channels
    actions = 2 * cfg.horizon * (cfg.action_dim * d + 3 * d * d + d * cfg.mlp_hidden + cfg.mlp_hidden * cfg.action_dim)
    states = 2 * cfg.state_tokens * (cfg.state_dim * cfg.mlp_hidden + cfg.mlp_hidden * d)
    return float(patch + text + image + time + head + actions + states)


def flops_per_sample(cfg: DreamZeroConfig, n_slots: int = 3) -> float:
    """Model FLOPs of one sample, forward + backward (3x the forward; with LoRA what runs: `lora_flops`),
    no recompute."""
    if cfg.lora_rank:
        return lora_flops(cfg)
    return 3.0 * (root_forward(cfg) + cfg.depth * block_forward(cfg))


def _frozen(tokens: int, i: int, o: int, grad_in: bool) -> int:
    """A frozen linear: its forward, and its input gradient when its input needs one."""
    return (1 + grad_in) * 2 * tokens * i * o


def _adapter(tokens: int, i: int, o: int, r: int, grad_in: bool) -> int:
    """A rank-r adapter: A's forward, weight gradient (and input gradient when needed); B's forward,
    weight and input gradients."""
    return (2 + grad_in) * 2 * tokens * i * r + 3 * 2 * tokens * r * o


def _attention(pairs: int, d: int, q: bool, k: bool, v: bool) -> int:
    """Forward QK^T and AV over `pairs`, and in backward dQ, dK (when q / k need gradients),
    dA (when q or k does) and dV."""
    unit = 2 * pairs * d
    return 2 * unit + unit * (q + k + (q or k) + v)


def _lora_block(cfg: DreamZeroConfig) -> int:
    """One block's forward + backward with LoRA on `cfg.lora_targets`; its input needs a gradient (the
    action and state tokens come from the trained encoders)."""
    d, r, tg, seq = cfg.dim, cfg.lora_rank, set(cfg.lora_targets), TokenSequence.of(cfg)
    t, text, img = seq.total, cfg.text_len, cfg.image_tokens

    def linear(name: str, tokens: int, i: int, o: int, grad_in: bool) -> tuple[int, bool]:
        adapted = name in tg
        return _frozen(tokens, i, o, grad_in) + (_adapter(tokens, i, o, r, grad_in) if adapted else 0), grad_in or adapted

    total, grads = 0, {}
    for name in ("q", "k", "v"):  # self-attention
        f, grads[name] = linear(name, t, d, d, True)
        total += f
    total += _attention(seq.attended_pairs, d, grads["q"], grads["k"], grads["v"])
    f, _ = linear("o", t, d, d, True)
    total += f
    f, q = linear("q", t, d, d, True)  # cross-attention: text K/V (targets), image K/V (never)
    kf, k = linear("k", text, d, d, False)
    vf, v = linear("v", text, d, d, False)
    total += f + kf + vf + 2 * _frozen(img, d, d, False)
    total += _attention(t * text, d, q, k, v) + _attention(t * img, d, q, False, False)
    for name, i, o in (("o", d, d), ("ffn.0", d, cfg.ffn), ("ffn.2", cfg.ffn, d)):
        f, _ = linear(name, t, i, o, True)
        total += f
    return total


def lora_flops(cfg: DreamZeroConfig) -> float:
    """FLOPs of one sample's forward + backward with LoRA: the frozen encoders of the features, patches
    and time (no gradient reaches them) forward only; every block (`_lora_block`); the frozen head
    forward and input gradient; the action/state MLPs trained in full, their first layers without
    an input gradient (the data)."""
    d, video, segments = cfg.dim, cfg.latent_frames * cfg.tokens_per_frame, cfg.blocks + 2
    frozen = (2 * 2 * video * cfg.in_dim * cfg.patch[1] * cfg.patch[2] * d
              + 2 * cfg.text_len * (cfg.text_width * d + d * d)
              + 2 * cfg.image_tokens * (cfg.image_width ** 2 + cfg.image_width * d)
              + 2 * segments * (cfg.freq_dim * d + d * d + 6 * d * d))
    head = _frozen(video, d, cfg.patch_channels, True)
    a, s, h = cfg.horizon, cfg.state_tokens, cfg.mlp_hidden
    trained = (2 * 2 * a * cfg.action_dim * d + 3 * 2 * a * 3 * d * d  # action encoder: W1; W2 (2d -> d), W3
               + 2 * 2 * s * cfg.state_dim * h + 3 * 2 * s * h * d  # state encoder
               + 3 * 2 * a * (d * h + h * cfg.action_dim))  # action decoder
    return float(frozen + head + trained + cfg.depth * _lora_block(cfg))


def blocks_attention_extra(cfg: DreamZeroConfig) -> int:
    """Elements of one sample's block that `attention = "blocks"` (attention.py) keeps beyond one
    attention: the key and value spans it concatenates for each noisy group (SDPA saves its own
    inputs) and each part's output before they are concatenated into the block's."""
    seq = TokenSequence.of(cfg)
    concatenated = sum(k1 - k0 for _, keys in seq.calls if len(keys) > 1 for k0, k1 in keys)
    return (2 * concatenated + seq.total) * cfg.dim


def activations(cfg: DreamZeroConfig, n_slots: int = 3) -> Activations:
    """Saved-for-backward elements of ONE sample, eager: per block the set kept without recompute,
    and its input (all a recomputed block keeps). Per token of a block: norm1 output and the
    modulated input (2), q, k, v, their normed and roped q, k (7), attention output, o output and
    the gated sum (3), norm3 output, cross q and normed q, the two attentions' outputs and their
    sum, o output (6), norm2 output, modulated input (2), the FFN's up output and GELU output
    (2 x ffn), down output and the gated sum (2): 22 x dim + 2 x ffn; plus the context's cross k,
    v and normed k (3 x dim per context token); plus, under the "blocks" attention, its
    concatenated key/value spans and per-part outputs (`blocks_attention_extra`). Outside the
    blocks: the clean and noisy latents and their patch tokens, the context embeddings."""
    d, t, c = cfg.dim, TokenSequence.of(cfg).total, cfg.context_tokens
    extra = blocks_attention_extra(cfg) if cfg.attention == "blocks" else 0
    block = (t * (22 * d + 2 * cfg.ffn) + 3 * c * d + extra, t * d)
    video = cfg.latent_frames * cfg.tokens_per_frame
    latents = 2 * video * cfg.in_dim * cfg.patch[1] * cfg.patch[2]
    root = latents + 2 * video * d + c * (d + cfg.text_width)
    return Activations(blocks={"blocks": [block] * cfg.depth}, root=root)


def lora_tokens(cfg: DreamZeroConfig) -> dict[str, int]:
    """Tokens of one sample through each LoRA target of a block (trainkit/models/lora.py): the DiT
    sequence for self-attention's q, k, v, o, cross-attention's q and o and the FFN; the text
    context for cross-attention's k and v (the image K/V, `k_img`/`v_img`, are not targets)."""
    t, text = TokenSequence.of(cfg).total, cfg.text_len
    return {"q": 2 * t, "k": t + text, "v": t + text, "o": 2 * t, "ffn.0": t, "ffn.2": t}


def lora_widths(cfg: DreamZeroConfig) -> dict[str, tuple[int, int, int]]:
    """(in, out, adapters) of each target name in one block (q, k, v, o in self- and cross-attention)."""
    d = cfg.dim
    return {"q": (d, d, 2), "k": (d, d, 2), "v": (d, d, 2), "o": (d, d, 2), "ffn.0": (d, cfg.ffn, 1),
            "ffn.2": (cfg.ffn, d, 1)}


def memory_terms(cfg: DreamZeroConfig, n_slots: int, switches: dict) -> dict[str, dict[str, list[int]]]:
    """What LoRA adds to a block's saved elements of one sample: each adapter's rank-r hidden
    `lora_A(x)` (lora_B's input, kept for its weight gradient); its input is the base linear's,
    already counted. Nothing without LoRA."""
    if not cfg.lora_rank:
        return {}
    tokens = lora_tokens(cfg)
    return {"lora": {"blocks": [cfg.lora_rank * sum(tokens[n] for n in cfg.lora_targets)] * cfg.depth}}

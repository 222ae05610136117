"""The analytic cost of one `dreamzero` sample: FLOPs (forward + backward), token counts, and the
activations autograd saves (inspect's memory estimate). Counts every matmul (2 FLOPs per
multiply-add) and attention's QK^T and AV over the pairs the block-causal pattern computes
(sequence.py: 30% of full attention's at 5b), not norms, modulation, RoPE or activations. The whole
DiT trains (3x its forward); the features come from the cache (no encoder runs). With LoRA the
base weights get no gradient, but the count stays the model's (3x), as MFU is counted.
`tests/trainkit/models/dreamzero/test_dreamzero.py` checks it against torch.utils.flop_counter on `tiny`.
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
    """Model FLOPs of one sample, forward + backward (3x the forward), no recompute."""
    return 3.0 * (root_forward(cfg) + cfg.depth * block_forward(cfg))


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

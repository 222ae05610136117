"""The analytic cost of one `dreamzero` sample: FLOPs (forward + backward), token counts, and the
activations autograd saves (inspect's memory estimate). Counts every matmul (2 FLOPs per
multiply-add) and attention's QK^T and AV over the pairs the block-causal pattern computes
(sequence.py: 33% of full attention's at 5b), not norms, modulation, activations or the embedding
lookup. Trained parts count 3x their forward, the frozen stand-ins 1x (forward only); recompute is
not counted. `tests/test_dreamzero.py` checks it against torch.utils.flop_counter on `tiny`.
The image-slot argument of the contract does not change anything here: the three views are one
canvas (datakit's tiling), whatever the batch carries.
"""
from __future__ import annotations

from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.sequence import TokenSequence
from trainkit.models.family import Activations


def tokens_per_sample(cfg: DreamZeroConfig, n_slots: int = 3) -> dict[str, int]:
    """Token counts of one sample: DiT sequence parts and the cross-attention context."""
    seq = TokenSequence.of(cfg)
    return {"video_clean": cfg.latent_frames * cfg.tokens_per_frame,
            "video_noisy": (cfg.latent_frames - 1) * cfg.tokens_per_frame, "actions": cfg.horizon,
            "state": cfg.state_tokens, "context": cfg.context_tokens, "sequence": seq.total}


def frozen_forward(cfg: DreamZeroConfig) -> float:
    """Forward FLOPs of the frozen stand-ins: the VAE patch map and the image patch map (the text
    stand-in is a lookup)."""
    h, w = cfg.latent_hw
    vae = 2 * cfg.latent_frames * h * w * cfg.vae_patch * cfg.latent_channels
    ch, cw = cfg.canvas
    image = 2 * cfg.image_grid ** 2 * 3 * (ch // cfg.image_grid) * (cw // cfg.image_grid) * cfg.image_width
    return float(vae + image)


def block_forward(cfg: DreamZeroConfig) -> float:
    """Forward FLOPs of one DiT block over one sample."""
    d, t, c = cfg.dim, TokenSequence.of(cfg).total, cfg.context_tokens
    pairs = TokenSequence.of(cfg).attended_pairs
    linear = 2 * t * (3 * d * d + d * d + d * d + d * d + 2 * d * cfg.ffn)  # qkv, o, cross q, cross o, MLP
    cross_kv = 2 * c * d * 2 * d
    return float(linear + cross_kv + 4 * pairs * d + 4 * t * c * d)


def trained_forward(cfg: DreamZeroConfig) -> float:
    """Forward FLOPs of the trained parts of one sample."""
    d, lf, tpf = cfg.dim, cfg.latent_frames, cfg.tokens_per_frame
    noisy_video = (lf - 1) * tpf
    groups = cfg.blocks + 1  # flow-time segments: clean + one per block
    embed = (2 * (lf * tpf + noisy_video) * cfg.patch_channels * d + 2 * cfg.horizon * cfg.action_dim * d
             + 2 * cfg.state_tokens * cfg.state_dim * d)
    context = 2 * cfg.text_len * (cfg.text_width * d + d * d) + 2 * cfg.image_tokens * (cfg.image_width * d + d * d)
    time = 2 * groups * (cfg.freq_dim * d + d * d) + 2 * groups * d * 6 * d
    heads = 2 * noisy_video * d * cfg.patch_channels + 2 * cfg.horizon * (d * d + d * cfg.action_dim)
    return float(embed + context + time + heads + cfg.depth * block_forward(cfg))


def flops_per_sample(cfg: DreamZeroConfig, n_slots: int = 3) -> float:
    """Model FLOPs of one sample, forward + backward: trained 3x, frozen 1x, no recompute."""
    return 3.0 * trained_forward(cfg) + frozen_forward(cfg)


def blocks_attention_extra(cfg: DreamZeroConfig) -> int:
    """Elements of one sample's block that `attention = "blocks"` (attention.py) keeps beyond one
    attention: the key and value spans it concatenates for each noisy part (SDPA saves its own
    inputs) and each part's output before they are concatenated into the block's. 2.51 GiB per
    sample over the 5b's 30 blocks; measured 2.41 (blocks minus flex at micro-batch 3, one H200:
    118.25 vs 111.03 GiB, /work/shared/gpu-runs/dreamzero_gpu.json and dz_flex.json)."""
    seq = TokenSequence.of(cfg)
    concatenated = sum(k1 - k0 for _, keys in seq.calls if len(keys) > 1 for k0, k1 in keys)
    return (2 * concatenated + seq.total) * cfg.dim


def activations(cfg: DreamZeroConfig, n_slots: int = 3) -> Activations:
    """Saved-for-backward elements of ONE sample, eager: per block the set kept without recompute,
    and its input (all a recomputed block keeps). Per token of a block: norm1 input/output and the
    modulated input (3), q, k, v and their normed q, k (5),
    attention output, o output (2), cross-attention's norm, q and normed q, output (4), norm2
    output, modulated input (2), the MLP's up output and GELU output (2 x ffn), down output (1):
    17 x dim + 2 x ffn; plus the context's cross k, v and normed k (3 x dim per context token);
    plus, under the "blocks" attention, its concatenated key/value spans and per-part outputs
    (`blocks_attention_extra`; "flex" and "dense" keep none: one kernel each, q, k, v and output).
    Outside the blocks: the video (the frozen stand-ins' input) and the clean/noisy latent tokens."""
    d, t, c = cfg.dim, TokenSequence.of(cfg).total, cfg.context_tokens
    extra = blocks_attention_extra(cfg) if cfg.attention == "blocks" else 0
    block = (t * (17 * d + 2 * cfg.ffn) + 3 * c * d + extra, t * d)
    h, w = cfg.canvas
    video = cfg.frames * 3 * h * w
    root = video + (2 * cfg.latent_frames - 1) * cfg.tokens_per_frame * (cfg.patch_channels + d)
    return Activations(blocks={"vae": [(video, video)], "text_encoder": [(0, 0)], "image_encoder": [(0, 0)],
                               "blocks": [block] * cfg.depth}, root=root)

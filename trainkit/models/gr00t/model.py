"""The `gr00t` model: GR00T N1.7's action head (action_head.py) on a vision-language backbone
(backbone.py: a stand-in of N1.7's shapes until the Qwen3-VL backbone lands), shapes config.py,
checkpoints weights.py.

Forward of one micro-batch:
1. under `torch.no_grad` (frozen: no autograd graph, so no gradient, no saved activation and no
   recompute): the vision tower over each kept slot's image, 2x2 merge, connector, text embedding,
   and the lower `lm_frozen` LLM layers over [image tokens; text tokens];
2. the top `lm_trained` LLM layers (`lm_layers`, none by default), then the head's LayerNorm and
   VL self-attention blocks (`vl_blocks`) on the VL features;
3. the action head on [state token (zeroed for the batch's `state_drop` samples in training);
   noisy action tokens]; loss = masked MSE of the predicted velocity against `actions - noise`,
   over the real action channels of the real (not padded) steps.
GR00T's flow convention (the opposite of Pi0.5's): x_t = (1 - t) noise + t actions, t in [0, 0.999),
drawn as t = (1 - Beta(1.5, 1)) x 0.999 (`sample_flow`); the embeddings see floor(t x 1000).
Noise and time come in the batch, so the loss is a pure function of (weights, batch), and a CUDA
graph of the step replays it with new draws (trainkit/parallel/cudagraphs.py). At inference
`sample_actions` runs the backbone once and integrates the head's velocity from noise (t = 0) to
actions (t = 1) in `SAMPLE_STEPS` Euler steps, as N1.6's `get_action` does.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn

from trainkit.models.gr00t.action_head import (ActionEncoder, DiTBlock, MLP2, OutputHead, TimeEmbedding, VLBlock,
                                               block_context)
from trainkit.models.gr00t.backbone import Connector, Qwen3Layer, causal_keep_mask, pixel_unshuffle
from trainkit.models.gr00t.config import UNSHUFFLE, Gr00tConfig
from trainkit.models.layers import SiglipBlock, rope_tables, seeded_normal_


@dataclass
class Gr00tBatch:
    """One micro-batch. B samples, S = image slots kept this batch (1..max_slots)."""
    images: torch.Tensor        # (B, S, 3, H, W) float, normalised; any float dtype
    image_mask: torch.Tensor    # (B, S) bool, True = the slot holds a real image
    tokens: torch.Tensor        # (B, text_len) int64 (Gr00tTokenizer)
    token_mask: torch.Tensor    # (B, text_len) bool, True = real token
    state: torch.Tensor         # (B, state_dim) float32, normalised, zero-padded
    actions: torch.Tensor       # (B, horizon, action_dim) float32 target chunk, zero-padded
    action_mask: torch.Tensor   # (B, horizon, action_dim) bool: real channel of a real (not padded) step
    noise: torch.Tensor         # (B, horizon, action_dim) float32 flow noise (sample_flow)
    time: torch.Tensor          # (B,) float32 flow time in [0, 0.999) (sample_flow)
    state_drop: torch.Tensor    # (B,) bool: the sample's state features are zeroed in training (state dropout)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Gr00tBatch:
        """The same batch with every tensor on `device` (dtypes unchanged)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                                for f in fields(self)})


def sample_flow(actions: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GR00T's draws for a (B, horizon, A) chunk: noise N(0, 1) and t = (1 - Beta(1.5, 1)) x 0.999.
    Beta(1.5, 1) is u^(1/1.5) for u uniform (its inverse CDF), drawn from `generator`."""
    b = actions.shape[0]
    noise = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=torch.float32)
    u = torch.rand((b,), generator=generator, device=actions.device, dtype=torch.float32)
    return noise, (1 - u.pow(1.0 / 1.5)) * 0.999


def flow_target(actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, velocity target) of GR00T's convention: x_t = (1 - t) noise + t a, target a - noise."""
    t = time.float()[:, None, None]
    return (1 - t) * noise + t * actions, actions - noise


SAMPLE_STEPS = 4  # Euler steps of the sampler: N1.6's num_inference_timesteps (LeRobot's GR00T head too)


@torch.no_grad()
def sample_actions(model: nn.Module, batch: Gr00tBatch, noise: torch.Tensor, steps: int = SAMPLE_STEPS) -> torch.Tensor:
    """GR00T's action sampler (N1.6's `get_action_with_features`): the VL features once, then from
    x = noise at t = 0, `steps` Euler steps of the head's velocity to t = 1: dt = 1/steps, t_i = i/steps
    (its bucket floor(t_i x time_buckets): 0, 250, 500, 750 at 4 steps), x <- x + dt * v(x, t_i).
    Returns the normalised action chunk (B, horizon, action_dim) fp32. The batch's actions, action
    mask, noise and time are not read."""
    context = model.conditioning(batch)
    dt = 1.0 / steps
    x = noise.float()
    for i in range(steps):
        t = torch.full((x.shape[0],), i / steps, dtype=torch.float32, device=x.device)
        x = x + dt * model.action_head(*context, replace(batch, time=t), x_t=x)[0]
    return x


class Gr00t(nn.Module):
    """GR00T N1.7 (n16 presets: N1.6-shaped). Block lists (BLOCK_LISTS): `vision_blocks` and `lm_frozen`
    (frozen), `lm_layers` (the trained top LLM layers; empty by default), `vl_blocks`, `dit_blocks`.
    The root's own frozen parts (patch embedding, vision positions and norm, connector, text
    embedding) are frozen here (FROZEN_ROOT)."""

    BLOCK_LISTS = ("vision_blocks", "lm_frozen", "lm_layers", "vl_blocks", "dit_blocks")
    FROZEN_ROOT = ("patch_embed", "vision_pos", "vision_norm", "connector", "embed")

    def __init__(self, cfg: Gr00tConfig):
        super().__init__()
        self.cfg = cfg
        vw, lw, dw = cfg.vision_width, cfg.lm_width, cfg.dit_width
        self.patch_embed = nn.Conv2d(3, vw, cfg.patch, stride=cfg.patch)
        self.vision_pos = nn.Parameter(torch.zeros(cfg.patches_per_image, vw))
        self.vision_blocks = nn.ModuleList(SiglipBlock(vw, cfg.vision_mlp, cfg.vision_heads)
                                           for _ in range(cfg.vision_depth))
        self.vision_norm = nn.LayerNorm(vw, eps=1e-6)
        self.connector = Connector(UNSHUFFLE ** 2 * vw, lw)
        self.embed = nn.Embedding(cfg.vocab, lw)
        layer = lambda: Qwen3Layer(lw, cfg.lm_mlp, cfg.heads_q, cfg.heads_kv, cfg.head_dim)  # noqa: E731
        self.lm_frozen = nn.ModuleList(layer() for _ in range(cfg.lm_frozen))
        self.lm_layers = nn.ModuleList(layer() for _ in range(cfg.lm_trained))
        self.vl_norm = nn.LayerNorm(lw)  # the head's `vlln`
        self.vl_blocks = nn.ModuleList(VLBlock(lw, cfg.vl_heads, cfg.dropout) for _ in range(cfg.vl_layers))
        self.time_embed = TimeEmbedding(dw)
        self.state_encoder = MLP2(cfg.state_dim, cfg.head_hidden, dw)
        self.action_encoder = ActionEncoder(cfg.action_dim, dw)
        self.action_pos = nn.Embedding(cfg.max_positions, dw)
        self.dit_blocks = nn.ModuleList(
            DiTBlock(dw, cfg.dit_heads, cfg.dit_ff, 0 if block_context(i) == "self" else lw, cfg.dropout)
            for i in range(cfg.dit_depth))
        self.dit_out = OutputHead(dw, cfg.head_hidden)
        self.action_decoder = MLP2(cfg.head_hidden, cfg.head_hidden, cfg.action_dim)
        for name in self.FROZEN_ROOT:
            getattr(self, name).requires_grad_(False)
        self.init_weights()

    @property
    def recompute_rng(self) -> bool:
        """Its blocks draw dropout masks in training: a recompute must replay the forward's RNG state
        (trainkit/parallel/activation_checkpoint.py)."""
        return self.cfg.dropout > 0

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialise every parameter from the seed of the global torch RNG: matrices,
        embeddings and the vision positions N(0, 0.02), each from its own generator keyed by (seed,
        its index in module order) so the values do not depend on which parameters FSDP shards
        (frozen ones may be replicated: parallel/frozen.py); biases 0, norm scales 1. Works after
        `to_empty()` from meta."""
        seed = torch.initial_seed()
        for i, (name, p) in enumerate(self.named_parameters()):
            if p.ndim >= 2:
                seeded_normal_(p, (seed * 1_000_003 + i) % (1 << 63), std=0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:  # LayerNorm / RMSNorm scales
                p.fill_(1.0)

    def vl_tokens(self, batch: Gr00tBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen part (call under no_grad): VL features after the lower LLM layers, (B, S x
        tokens_per_image + text_len, lm_width), and their validity (B, same) bool."""
        cfg, (b, s) = self.cfg, batch.images.shape[:2]
        images = torch.where(batch.image_mask[:, :, None, None, None], batch.images, 0)
        x = self.patch_embed(images.flatten(0, 1).to(self.patch_embed.weight.dtype))
        x = x.flatten(2).transpose(1, 2) + self.vision_pos
        for block in self.vision_blocks:
            x = block(x)
        x = pixel_unshuffle(self.vision_norm(x), cfg.image_height // cfg.patch, cfg.image_width // cfg.patch)
        img = self.connector(x).reshape(b, s * cfg.tokens_per_image, cfg.lm_width)
        h = torch.cat([img, self.embed(batch.tokens).to(img.dtype)], dim=1)
        keep = torch.cat([batch.image_mask.repeat_interleave(cfg.tokens_per_image, dim=1), batch.token_mask], dim=1)
        return h, keep

    def vl_features(self, batch: Gr00tBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone: VL features after the top LLM layers (B, S x tokens_per_image + text_len,
        lm_width) and their validity (B, same) bool; the frozen part under no_grad."""
        cfg = self.cfg
        with torch.no_grad():
            h, keep = self.vl_tokens(batch)
            mask = causal_keep_mask(keep)
            positions = (keep.long().cumsum(dim=1) - 1).clamp(min=0)
            cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
            for layer in self.lm_frozen:
                h = layer(h, cos, sin, mask)
        for layer in self.lm_layers:
            h = layer(h, cos, sin, mask)
        return h, keep

    def action_head(self, vl: torch.Tensor, image_mask: torch.Tensor, keep: torch.Tensor, n_image: int,
                    batch: Gr00tBatch, x_t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(predicted velocity, target) (B, horizon, action_dim) fp32 from the backbone's features vl
        (B, T, lm_width), which of them are image tokens (image_mask (B, T) bool, `n_image` per sample)
        and which are valid (keep (B, T) bool: LeRobot's backbone_attention_mask), and the batch's
        state, actions, noise, time and state dropout. `x_t` given (the sampler): the velocity at these
        noisy actions, and no target (None)."""
        cfg = self.cfg
        vl = self.vl_norm(vl)
        vl_keep = keep | ~image_mask  # text padding stays visible as in LeRobot; a missing camera's tokens do not
        for block in self.vl_blocks:
            vl = block(vl, vl_keep)
        text, image = split_context(vl, image_mask, keep, n_image)
        context = {"text": text, "image": image, "self": (None, None)}
        target = None
        if x_t is None:
            x_t, target = flow_target(batch.actions.float(), batch.noise.float(), batch.time)
        buckets = (batch.time.float() * cfg.time_buckets).long()
        dtype = self.action_encoder.W1.weight.dtype
        temb = self.time_embed(buckets)
        actions = self.action_encoder(x_t.to(dtype), buckets) + self.action_pos.weight[: cfg.horizon].to(dtype)
        state = self.state_encoder(batch.state.to(dtype))[:, None]
        if self.training and cfg.state_dropout > 0:
            state = state * (~batch.state_drop)[:, None, None].to(state.dtype)
        x = torch.cat([state, actions], dim=1)
        for i, block in enumerate(self.dit_blocks):
            x = block(x, temb, *context[block_context(i)])
        return self.action_decoder(self.dit_out(x, temb))[:, -cfg.horizon:].float(), target

    def conditioning(self, batch: Gr00tBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """What the action head reads: the VL features (vl_features, laid out [image tokens; text
        tokens]), which positions are image tokens and which are valid, each (B, T), and the image
        tokens per sample."""
        vl, keep = self.vl_features(batch)
        n_image = batch.images.shape[1] * self.cfg.tokens_per_image
        image_mask = (torch.arange(keep.shape[1], device=keep.device) < n_image)[None].expand_as(keep)
        return vl, image_mask, keep, n_image

    def forward(self, batch: Gr00tBatch) -> torch.Tensor:
        """Scalar masked flow-matching MSE (fp32) of the batch, normalised as GR00T's (sum / (mask sum + 1e-6))."""
        pred, target = self.action_head(*self.conditioning(batch), batch)
        weight = batch.action_mask.float()
        return ((pred - target).square() * weight).sum() / (weight.sum() + 1e-6)


def split_context(vl: torch.Tensor, image_mask: torch.Tensor, keep: torch.Tensor,
                  n_image: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((text tokens, their valid keys), (image tokens, their valid keys)) of a VL sequence whose
    samples each hold `n_image` image tokens anywhere in it (N1.7's chat layout puts them inline):
    a stable sort brings each sample's text positions first and its image positions last, both in
    sequence order. Attention over these equals LeRobot's over the whole sequence under the key
    masks `~image_mask & keep` and `image_mask & keep` (a masked key adds nothing), at the cost of
    the keys it reads: the K/V projections of a cross block run over its own tokens only. A sample
    with no valid key of a kind (no camera) attends to all of that kind's (zero images' tokens), not
    to nothing (NaN); LeRobot's samples always have one."""
    order = torch.argsort(image_mask.to(torch.uint8), dim=1, stable=True)
    tokens = torch.gather(vl, 1, order[..., None].expand(-1, -1, vl.shape[-1]))
    valid = torch.gather(keep, 1, order)
    t = vl.shape[1] - n_image
    out = []
    for part, ok in ((tokens[:, :t], valid[:, :t]), (tokens[:, t:], valid[:, t:])):
        out.append((part, ok | ~ok.any(dim=1, keepdim=True)))
    return out[0], out[1]

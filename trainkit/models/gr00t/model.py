"""The `gr00t` model: GR00T N1.7, its Qwen3-VL backbone (qwen3_vl/: backbone, vision, text, config,
mrope) and its action head (action_head.py); shapes config.py, checkpoints weights.py.

Forward of one micro-batch:
1. under `torch.no_grad` (frozen: no autograd graph, so no gradient, no saved activation and no
   recompute): the ViT over each kept slot's view (deepstack tokens too), the token embedding with
   the image tokens written at their <|image_pad|> runs, and the lower `lm_frozen` LLM layers over
   [image runs; prompt tokens] with interleaved mRoPE, the deepstack tokens added after layers 0, 1, 2;
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
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.lora import targets as lora_targets
from trainkit.models.gr00t.qwen3_vl.mrope import mrope_positions, mrope_tables
from trainkit.models.gr00t.qwen3_vl.text import TextLayer, padded_causal_mask
from trainkit.models.gr00t.qwen3_vl.vision import VisionTower
from trainkit.models.layers import seeded_normal_
from trainkit.models.lora import apply_lora, init_lora


@dataclass
class Gr00tBatch:
    """One micro-batch. B samples, S = image slots kept this batch (1..max_slots)."""
    images: torch.Tensor        # (B, S, 3, H, W) float, normalised; any float dtype
    image_mask: torch.Tensor    # (B, S) bool, True = the slot holds a real image
    tokens: torch.Tensor        # (B, T) int64 LLM input: the chat turn with each slot's image run (chat_tokenizer.py)
    token_mask: torch.Tensor    # (B, T) bool, True = real token (the prompts are left-padded)
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


@dataclass
class Gr00tCachedBatch:
    """One micro-batch whose backbone ran offline (`trainkit encode-backbone`, cache.py): the VL
    features at select_layer and their masks in place of the images and tokens. The head's inputs
    are the rest of `Gr00tBatch`'s, unchanged."""
    vl: torch.Tensor            # (B, T, lm_width) the frozen backbone's output (vl_features' first value)
    vl_image: torch.Tensor      # (B, T) bool: image token positions
    valid: torch.Tensor         # (B, T) bool: valid positions (LeRobot's backbone_attention_mask)
    seen: torch.Tensor          # (B, T) bool: what the VL self-attention sees
    n_image: int                # image tokens per sample (the encode's slots x tokens_per_image)
    state: torch.Tensor
    actions: torch.Tensor
    action_mask: torch.Tensor
    noise: torch.Tensor
    time: torch.Tensor
    state_drop: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Gr00tCachedBatch:
        return replace(self, **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                                for f in fields(self) if f.name != "n_image"})


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
    """GR00T N1.7. Block lists (BLOCK_LISTS): `vision_blocks` and `lm_frozen` (frozen), `lm_layers`
    (the trained top LLM layers; none by default), `vl_blocks`, `dit_blocks`. The backbone's other
    parts (the ViT's patch embedding, position table and mergers: `visual`; the token embedding:
    `embed`) are frozen at the root (FROZEN_ROOT)."""

    BLOCK_LISTS = ("vision_blocks", "lm_frozen", "lm_layers", "vl_blocks", "dit_blocks")
    FROZEN_ROOT = ("visual", "embed")

    def __init__(self, cfg: Gr00tConfig):
        super().__init__()
        self.cfg = cfg
        bcfg, lw, dw = cfg.backbone, cfg.lm_width, cfg.dit_width
        # the ViT's blocks as a block list of the root (FSDP, compile, frozen handling address them by
        # name); the rest of the tower (qwen3_vl/vision.py) stays one module
        tower = VisionTower(bcfg)
        self.vision_blocks = tower.blocks
        del tower.blocks
        self.visual = tower
        self.embed = nn.Embedding(cfg.vocab, lw)
        self.lm_frozen = nn.ModuleList(TextLayer(bcfg) for _ in range(cfg.lm_frozen))
        self.lm_layers = nn.ModuleList(TextLayer(bcfg) for _ in range(cfg.lm_trained))
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
        if cfg.lora_rank:  # LoRA: everything frozen but the adapters (Isaac-GR00T: no modules_to_save)
            self.requires_grad_(False)
            apply_lora(self, lora_targets(cfg), cfg.lora_rank, cfg.lora_alpha)
        self.init_weights()

    @property
    def recompute_rng(self) -> bool:
        """Its blocks draw dropout masks in training: a recompute must replay the forward's RNG state
        (trainkit/parallel/activation_checkpoint.py)."""
        return self.cfg.dropout > 0

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialise every parameter from the seed of the global torch RNG: matrices,
        embeddings and the ViT's position table N(0, 0.02), each from its own generator keyed by
        (seed, its index in module order) so the values do not depend on which parameters FSDP
        shards (frozen ones may be replicated: parallel/frozen.py); biases 0, norm scales 1. Works
        after `to_empty()` from meta."""
        seed = torch.initial_seed()
        for i, (name, p) in enumerate(self.named_parameters()):
            if p.ndim >= 2:
                seeded_normal_(p, (seed * 1_000_003 + i) % (1 << 63), std=0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:  # LayerNorm / RMSNorm scales
                p.fill_(1.0)
        init_lora(self)  # adapters: A kaiming, B zero (peft's init)

    def vision(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The ViT (qwen3_vl/vision.py's VisionTower.forward over this model's block list): views
        (N, 3, H, W) -> (image tokens (N, tokens_per_image, lm_width), deepstack tokens per deepstack block)."""
        return self.visual(images, blocks=self.vision_blocks)

    def vl_inputs(self, batch: Gr00tBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids (B, T), valid (B, T) bool, seen (B, T) bool) of the LLM: the batch's prompt
        tokens (chat_tokenizer.py's layout, LeRobot's: left-padded, per kept slot <|vision_start|>, its
        run of `tokens_per_image` <|image_pad|>, <|vision_end|>, inline in the chat turn). A slot the
        sample lacks keeps its run (a zero view's tokens) but invalid: no token sees it and it takes
        no mRoPE position, as if the slot were pruned. `seen`: every position but such a run (the
        VL self-attention's keys: it sees text padding, as LeRobot's, never a missing camera)."""
        cfg, ids = self.cfg, batch.tokens
        # built by device ops, no host list copied in: the step is captured in a CUDA graph
        starts = (ids == cfg.vision_start_id).long().cumsum(1)  # runs begun at or before each position
        ends = (ids == cfg.vision_end_id).long()
        inside = starts - ends.cumsum(1) + ends > 0  # from a <|vision_start|> to its <|vision_end|>, both included
        slot = (starts - 1).clamp(0, batch.image_mask.shape[1] - 1)
        missing = inside & ~batch.image_mask.gather(1, slot)
        return ids, batch.token_mask & ~missing, ~missing

    def vl_features(self, batch: Gr00tBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The backbone (qwen3_vl/backbone.py's Qwen3VLBackbone.forward, split at the frozen / trained LLM
        layers): the features of the last LLM layer before the final norm (B, T, lm_width), which
        positions are image tokens, which are valid and which the VL self-attention sees (B, T) bool
        (vl_inputs). The frozen part under no_grad."""
        cfg = self.cfg
        input_ids, valid, seen = self.vl_inputs(batch)
        image_mask = input_ids == cfg.image_token_id
        with torch.no_grad():
            images = torch.where(batch.image_mask[:, :, None, None, None], batch.images, 0).flatten(0, 1)
            tokens, deep = self.vision(images.to(self.visual.patch_embed.proj.weight.dtype))
            h = self.embed(input_ids)
            where = image_mask[:, :, None]
            h = h.masked_scatter(where, tokens.to(h.dtype))
            # deepstack added where the images sit and 0 elsewhere: no gather, no data-dependent shape
            deep = [torch.zeros_like(h).masked_scatter(where, d.to(h.dtype)) for d in deep]
            positions = mrope_positions(input_ids, valid, cfg.image_token_id, cfg.backbone.merged_grid)
            cos, sin = mrope_tables(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
            mask, queried = padded_causal_mask(valid)  # queried: the queries with a valid key at or before them
            h = self._layers(self.lm_frozen, 0, h, cos, sin, mask, queried, deep)
        h = self._layers(self.lm_layers, cfg.lm_frozen, h, cos, sin, mask, queried, deep)
        return h, image_mask, valid, seen

    def _layers(self, layers: nn.ModuleList, first: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, queried: torch.Tensor, deep: list[torch.Tensor]) -> torch.Tensor:
        """LLM layers `first`, `first + 1`, ...; after layer i < len(deep) (not the last) the i-th deepstack tokens."""
        for i, layer in enumerate(layers, start=first):
            h = layer(h, cos, sin, mask, queried)
            if i < len(deep) and i < self.cfg.lm_depth - 1:
                h = h + deep[i]
        return h

    def action_head(self, vl: torch.Tensor, image_mask: torch.Tensor, keep: torch.Tensor, seen: torch.Tensor | None,
                    n_image: int, batch: Gr00tBatch,
                    x_t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(predicted velocity, target) (B, horizon, action_dim) fp32 from the backbone's features vl
        (B, T, lm_width), which of them are image tokens (image_mask (B, T) bool, `n_image` per sample),
        which are valid (keep (B, T) bool: LeRobot's backbone_attention_mask) and which the VL
        self-attention sees (seen (B, T) bool, None: all, as LeRobot), and the batch's state, actions,
        noise, time and state dropout. `x_t` given (the sampler): the velocity at these noisy actions,
        and no target (None)."""
        cfg = self.cfg
        vl = self.vl_norm(vl)
        for block in self.vl_blocks:
            vl = block(vl, seen)
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

    def conditioning(self, batch: Gr00tBatch | Gr00tCachedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                           torch.Tensor, int]:
        """What the action head reads: the VL features, which positions are image tokens, which are
        valid and which the VL self-attention sees (vl_features), and the image tokens per sample;
        a cached batch carries them (the backbone does not run)."""
        if isinstance(batch, Gr00tCachedBatch):
            return batch.vl, batch.vl_image, batch.valid, batch.seen, batch.n_image
        return (*self.vl_features(batch), batch.image_mask.shape[1] * self.cfg.tokens_per_image)

    def forward(self, batch: Gr00tBatch | Gr00tCachedBatch,
                per_item: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Scalar masked flow-matching MSE (fp32) of the batch, normalised as GR00T's (sum / (mask sum + 1e-6));
        `per_item`: (that loss, each sample's (B,) over its own mask, detached), for the per-source loss."""
        pred, target = self.action_head(*self.conditioning(batch), batch)
        weight = batch.action_mask.float()
        loss = ((pred - target).square() * weight).sum() / (weight.sum() + 1e-6)
        if not per_item:
            return loss
        return loss, ((pred.detach() - target).square() * weight).sum(dim=(1, 2)) / (weight.sum(dim=(1, 2)) + 1e-6)


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

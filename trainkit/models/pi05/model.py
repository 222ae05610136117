"""The `pi05` model family: a Pi0.5-shaped vision-language-action model (random init), after OpenPI.

SigLIP tower (patchify conv + `vision_blocks`) -> projector -> prefix [image tokens of the slots
present; text tokens]; suffix = `horizon` noisy action tokens. `lm_layers` are mixture-of-transformers
layers (pi05/mot.py): the Gemma backbone handles the prefix, the action expert (adaRMSNorm on
the flow time) the suffix, one joint attention per layer. The loss is flow-matching MSE:
x_t = t * noise + (1 - t) * actions, target = noise - actions, prediction = the expert's output.
Noise and time come in the batch (`sample_flow` draws them), so the loss is a pure function of
(weights, batch). At inference `sample_actions` integrates the velocity from noise (t = 1) to
actions (t = 0) in `SAMPLE_STEPS` Euler steps, as openpi and LeRobot do. RoPE positions count only VALID prefix tokens, so pruning an empty image slot and
keeping it masked give the same loss. Shapes and FLOPs: pi05/config.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainkit.models.layers import RMSNorm, SiglipBlock, ada_rms_norm, rope_tables
from trainkit.models.lora import apply_lora, init_lora
from trainkit.models.pi05.config import Pi05Config
from trainkit.models.pi05.lora import targets as lora_targets
from trainkit.models.pi05.mot import MoTLayer

@dataclass
class Pi05Batch:
    """One micro-batch. B samples, S = image slots kept this batch (1..max_slots)."""
    images: torch.Tensor       # (B, S, 3, H, W) float, normalised; any float dtype
    image_mask: torch.Tensor   # (B, S) bool, True = the slot holds a real image
    tokens: torch.Tensor       # (B, text_len) int64 prompt tokens (PromptTokenizer)
    token_mask: torch.Tensor   # (B, text_len) bool, True = real token
    actions: torch.Tensor      # (B, horizon, action_dim) float32 target action chunk
    noise: torch.Tensor        # (B, horizon, action_dim) float32 flow noise (sample_flow)
    time: torch.Tensor         # (B,) float32 flow time in (0, 1] (sample_flow)
    action_dims: int = 0       # the robot's real action channels (the rest is zero padding); 0: all
    # A mixture's robots: each item's real action channels (B, action_dim) bool, instead of action_dims
    action_mask: torch.Tensor | None = None
    # Host-known hint: every slot and token is valid, so attention runs without a mask (flash path).
    # Only set it when known without a device sync; a wrong True silently attends to padding.
    all_valid: bool = False

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Pi05Batch:
        """The same batch with every tensor on `device` (dtypes unchanged)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=non_blocking)
        return replace(self, **moved)


def sample_flow(actions: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pi0.5's flow-matching draws for a batch of actions: noise ~ N(0, 1) like `actions` (float32),
    time t ~ Beta(1.5, 1) * 0.999 + 0.001, shape (B,). Beta(a, 1) is sampled as U^(1/a) (inverse CDF)
    so `generator` controls it."""
    b = actions.shape[0]
    noise = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=torch.float32)
    u = torch.rand(b, generator=generator, device=actions.device, dtype=torch.float32)
    return noise, u.pow(1.0 / 1.5) * 0.999 + 0.001


SAMPLE_STEPS = 10  # Euler steps of the sampler: LeRobot's PI05Config.num_inference_steps, openpi's default


@torch.no_grad()
def sample_actions(model: nn.Module, batch: Pi05Batch, noise: torch.Tensor, steps: int = SAMPLE_STEPS) -> torch.Tensor:
    """Pi0.5's action sampler (openpi's `sample_actions`, LeRobot 0.6.1's `euler_integrate`): from
    x = noise at t = 1, `steps` Euler steps of the velocity to t = 0: dt = -1/steps, t_i = 1 + i dt
    (float32, one per sample), x <- x + dt * v(x, t_i). Returns the normalised action chunk (B,
    horizon, action_dim) fp32. The batch's actions, noise and time are not read. The prefix is
    computed again at every step (LeRobot caches its keys and values: the same numbers, 10x the
    prefix cost)."""
    dt = -1.0 / steps
    x = noise.float()
    for i in range(steps):
        t = torch.full((x.shape[0],), 1.0 + i * dt, dtype=torch.float32, device=x.device)
        x = x + dt * model.velocity(replace(batch, time=t), x_t=x)
    return x


def time_features(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """Sin/cos embedding (B, dim) of the flow time, log-spaced periods (OpenPI's posemb_sincos), in
    float64 as LeRobot and openpi compute it (float32 differs by up to 1.2e-4 at full width), returned
    as float32."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, device=t.device, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * t.float()[:, None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1).float()


class Pi05(nn.Module):
    """Pi0.5-shaped VLA. Block lists for parallel code: `vision_blocks`, `lm_layers` (BLOCK_LISTS)."""

    BLOCK_LISTS = ("vision_blocks", "lm_layers")

    def __init__(self, cfg: Pi05Config):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(3, cfg.vision_width, cfg.patch, stride=cfg.patch)
        self.vision_pos = nn.Parameter(torch.zeros(cfg.tokens_per_image, cfg.vision_width))
        self.vision_blocks = nn.ModuleList(
            SiglipBlock(cfg.vision_width, cfg.vision_mlp, cfg.vision_heads) for _ in range(cfg.vision_depth))
        self.vision_norm = nn.LayerNorm(cfg.vision_width, eps=1e-6)
        self.projector = nn.Linear(cfg.vision_width, cfg.lm_width)
        self.embed = nn.Embedding(cfg.vocab, cfg.lm_width)
        self.action_in = nn.Linear(cfg.action_dim, cfg.expert_width)
        self.time_in = nn.Linear(cfg.expert_width, cfg.expert_width)
        self.time_out = nn.Linear(cfg.expert_width, cfg.expert_width)
        self.lm_layers = nn.ModuleList(
            MoTLayer(lm_width=cfg.lm_width, lm_mlp=cfg.lm_mlp, expert_width=cfg.expert_width,
                     expert_mlp=cfg.expert_mlp, heads_q=cfg.heads_q, heads_kv=cfg.heads_kv,
                     head_dim=cfg.head_dim, prefix_out=i < cfg.lm_depth - 1)
            for i in range(cfg.lm_depth))
        self.final_ada = nn.Linear(cfg.expert_width, 2 * cfg.expert_width)  # adaRMSNorm (scale, shift)
        self.action_out = nn.Linear(cfg.expert_width, cfg.action_dim)
        if cfg.lora_rank:  # LoRA: everything frozen but the adapters (LeRobot's modules_to_save = [])
            self.requires_grad_(False)
            apply_lora(self, lora_targets(cfg), cfg.lora_rank, cfg.lora_alpha)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialise every parameter from the global torch RNG, in module order: matrices
        N(0, 0.02), biases 0, norm scales 1, adaRMSNorm modulations 0 (= the plain norm).
        Works after `to_empty()` from the meta device."""
        zero_init = {id(self.final_ada)} | {id(l.expert.ada) for l in self.lm_layers}
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                if id(module) in zero_init:
                    nn.init.zeros_(module.weight)
                else:
                    nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.vision_pos, std=0.02)
        init_lora(self)  # adapters: A kaiming, B zero (peft's init)

    def embed_images(self, images: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
        """(B, S, 3, H, W) -> (B, S * tokens_per_image, lm_width). Masked slots are zeroed first so
        whatever the loader left there (even NaN) cannot reach valid tokens through 0 * NaN."""
        b, s = images.shape[:2]
        images = torch.where(image_mask[:, :, None, None, None], images, 0)
        x = self.patch_embed(images.flatten(0, 1).to(self.patch_embed.weight.dtype))
        x = x.flatten(2).transpose(1, 2) + self.vision_pos
        for block in self.vision_blocks:
            x = block(x)
        return self.projector(self.vision_norm(x)).reshape(b, s * self.cfg.tokens_per_image, self.cfg.lm_width)

    def prefix_positions(self, prefix_keep: torch.Tensor) -> torch.Tensor:
        """RoPE positions (B, P + horizon): valid prefix tokens count 0, 1, ...; masked ones repeat
        the last valid position (never read); the suffix continues after the valid prefix."""
        counts = prefix_keep.long().cumsum(dim=1)
        suffix = counts[:, -1:] + torch.arange(self.cfg.horizon, device=counts.device)
        return torch.cat([(counts - 1).clamp(min=0), suffix], dim=1)

    def velocity(self, batch: Pi05Batch, x_t: torch.Tensor | None = None) -> torch.Tensor:
        """The action expert's flow velocity prediction (B, horizon, action_dim), fp32, at the noisy
        actions `x_t` and time `batch.time`; `x_t` None: the training point t * noise + (1 - t) * actions
        (given, the batch's actions and noise are not read: the sampler's case)."""
        cfg = self.cfg
        img = self.embed_images(batch.images, batch.image_mask)
        txt = self.embed(batch.tokens) * math.sqrt(cfg.lm_width)
        xp = torch.cat([img, txt.to(img.dtype)], dim=1)
        prefix_keep = torch.cat([batch.image_mask.repeat_interleave(cfg.tokens_per_image, dim=1),
                                 batch.token_mask], dim=1)
        cos, sin = rope_tables(self.prefix_positions(prefix_keep), cfg.head_dim, cfg.rope_theta)

        if x_t is None:
            t = batch.time.float()[:, None, None]
            x_t = t * batch.noise.float() + (1 - t) * batch.actions.float()
        dtype = self.action_in.weight.dtype
        xs = self.action_in(x_t.to(dtype))
        cond = F.silu(self.time_out(F.silu(self.time_in(time_features(batch.time, cfg.expert_width).to(dtype)))))

        keep = None if batch.all_valid else prefix_keep
        for layer in self.lm_layers:
            xp, xs = layer(xp, xs, cond, cos, sin, keep)
        scale, shift = self.final_ada(cond).unsqueeze(1).chunk(2, dim=-1)
        return self.action_out(ada_rms_norm(xs, scale, shift)).float()

    def forward(self, batch: Pi05Batch, per_item: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Scalar flow-matching MSE loss (fp32) of the batch, averaged over every action channel
        (`loss_over = "all"`, openpi) or the robot's real ones (`"real"`, LeRobot's PI05Policy; a
        mixture's items each over their own, `action_mask`);
        `per_item`: (that loss, each sample's (B,), detached), the family contract's per-source loss."""
        pred, target = self.velocity(batch), batch.noise.float() - batch.actions.float()
        if self.cfg.loss_over == "real" and batch.action_mask is not None:  # each item over its own robot's
            real = batch.action_mask[:, None, :].expand_as(pred).float()
            error = (pred - target).square() * real
            loss = error.sum() / real.sum()
            return (loss, error.detach().sum(dim=(1, 2)) / real.sum(dim=(1, 2))) if per_item else loss
        if self.cfg.loss_over == "real" and batch.action_dims:
            pred, target = pred[..., :batch.action_dims], target[..., :batch.action_dims]
        loss = F.mse_loss(pred, target)
        return (loss, (pred.detach() - target).square().mean(dim=(1, 2))) if per_item else loss

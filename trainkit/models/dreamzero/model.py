"""The `dreamzero` model: DreamZero's Wan DiT with action and state tokens (the official
`CausalWanModel`, Wan's original parameter names, so checkpoints map one to one: weights.py).

Inputs are features (a `datakit encode` cache, or the frame path's stand-ins in batches.py): clean
VAE latents (B, C, F, H, W), umT5 text embeddings (B, 512, 4096), CLIP features (B, 257, 1280), the
states and the actions. No encoder runs here.

The block is Wan's original layout: `norm1` (LayerNorm without affine) modulated by shift/scale ->
self-attention (q, k, v, o; RMSNorm over the full width on q and k; RoPE: rope.py; block-causal:
sequence.py, attention.py) -> gate; `norm3` (affine LayerNorm) -> I2V cross-attention: text K/V
and image K/V (`k_img`, `v_img`, `norm_k_img`) with one softmax each, the two outputs summed, then
`o`; `norm2` modulated -> gelu-tanh FFN (`ffn.0`, `ffn.2`) -> gate. `modulation` (1, 6, dim) plus
the time projection gives the six (shift, scale, gate) x 2. Text MLP 4096 -> d -> d (gelu-tanh);
time sinusoid 256 -> d -> d (SiLU), then SiLU + Linear d -> 6d; image MLPProj LN(1280) -> 1280 ->
GELU -> d -> LN(d); head: LayerNorm without affine modulated by `head.modulation` (1, 2, d) plus the
time embedding, Linear d -> out x patch.

Actions and states are tokens of the same DiT: `action_encoder` (W1 a -> d; W2 [W1 a; sin/cos of
the action's timestep] -> d, swish; W3 d -> d), `state_encoder` and `action_decoder` (two-layer
ReLU MLPs), each "category-specific" with one category (weights (1, in, out), DreamZero's names).

Training (`forward`): DreamZero's teacher forcing with the discrete flow-matching schedule
(schedule.py): each latent frame noised at its step's sigma (a block's frames share one; frame 0
its own), the actions at their block's; velocity targets noise - x; loss = video MSE per frame x
the schedule's weight + action MSE under the action mask x the weight of its block.
`wan` runs the DiT as plain Wan (no action/state tokens, one time per sample, dense attention):
what tests/trainkit/models/dreamzero/test_dreamzero_diffusers_parity.py compares with diffusers' `WanTransformer3DModel`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainkit.models.dreamzero.attention import block_causal_attention
from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.rope import apply_rope, rope_tables
from trainkit.models.dreamzero.schedule import sigmas
from trainkit.models.dreamzero.sequence import TokenSequence
from trainkit.models.layers import RMSNorm
from trainkit.models.lora import apply_lora, init_lora, suffix_targets


@dataclass
class DreamZeroBatch:
    """One micro-batch of features; B samples, F latent frames, n = cfg.blocks blocks."""
    latents: torch.Tensor      # (B, C, F, H, W) clean VAE latents (the posterior mode)
    cond: torch.Tensor         # (B, 4 + C, F, H, W) Wan2.1-I2V conditioning (mask + first frame), or (B, 0, F, H, W)
    text: torch.Tensor         # (B, text_len, text_width) umT5 embeddings, zero past the prompt (Wan's padding)
    image: torch.Tensor        # (B, image_tokens, image_width) CLIP features of the first frame
    state: torch.Tensor        # (B, n * states_per_block, state_dim) float32, normalised, zero-padded
    actions: torch.Tensor      # (B, n * actions_per_block, action_dim) float32, normalised, zero-padded
    action_mask: torch.Tensor  # like actions, float32: 1 where the robot has the channel (and the action is real)
    noise: torch.Tensor        # like latents, float32
    action_noise: torch.Tensor  # like actions, float32
    sigma: torch.Tensor        # (B, F) float32 noise level of each latent frame (a block's frames share one)
    weight: torch.Tensor       # (B, F) float32 the schedule's training weight of each frame's step

    def to(self, device: torch.device | str, non_blocking: bool = True) -> DreamZeroBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device, non_blocking=non_blocking) for k, v in moved.items()})


SAMPLE_STEPS = 16  # Euler steps of the sampler: DreamZero's WANPolicyHead default num_inference_steps


def token_index(seq: TokenSequence, which: str, device: torch.device) -> torch.Tensor:
    """`seq`'s index tensor `which` ("noisy_video_index" | "action_index") on `device`, copied once:
    a host-to-device copy a step would be a sync and, inside a CUDA graph's capture, refused."""
    return _token_index(seq, which, str(torch.device(device)))


@lru_cache(maxsize=16)
def _token_index(seq: TokenSequence, which: str, device: str) -> torch.Tensor:
    return getattr(seq, which)().to(device)


def time_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Wan's sinusoidal_embedding_1d of timesteps (0..1000 scale): [cos, sin], float64 math, float32 out."""
    half = dim // 2
    freq = torch.pow(10_000.0, -torch.arange(half, device=t.device, dtype=torch.float64) / half)
    angle = t.double()[..., None] * freq
    return torch.cat([angle.cos(), angle.sin()], dim=-1).float()


def action_time_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """GR00T's SinusoidalPositionalEncoding (DreamZero's action encoder): [sin, cos], float32."""
    half = dim // 2
    freq = torch.exp(-torch.arange(half, device=t.device, dtype=torch.float32) * (math.log(10_000.0) / half))
    angle = t.float()[..., None] * freq
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


class CategoryLinear(nn.Module):
    """DreamZero's CategorySpecificLinear with one category: x @ W[0] + b[0]; W (1, in, out)."""

    def __init__(self, inp: int, out: int):
        super().__init__()
        self.W = nn.Parameter(torch.empty(1, inp, out))
        self.b = nn.Parameter(torch.empty(1, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W[0].to(x.dtype) + self.b[0].to(x.dtype)


class CategoryMLP(nn.Module):
    """DreamZero's CategorySpecificMLP: layer2(relu(layer1(x)))."""

    def __init__(self, inp: int, hidden: int, out: int):
        super().__init__()
        self.layer1, self.layer2 = CategoryLinear(inp, hidden), CategoryLinear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x)))


class ActionEncoder(nn.Module):
    """DreamZero's MultiEmbodimentActionEncoder with one category."""

    def __init__(self, action_dim: int, dim: int):
        super().__init__()
        self.dim = dim
        self.W1, self.W2, self.W3 = CategoryLinear(action_dim, dim), CategoryLinear(2 * dim, dim), CategoryLinear(dim, dim)

    def forward(self, actions: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """actions (B, A, action_dim), timesteps (B, A) on the 0..1000 scale."""
        a = self.W1(actions)
        x = torch.cat([a, action_time_features(timesteps, self.dim).to(a.dtype)], dim=-1)
        return self.W3(F.silu(self.W2(x)))


def segmented(y: torch.Tensor, mod: torch.Tensor, segments: tuple[tuple[int, ...], int], shift: int, scale: int,
              ) -> torch.Tensor:
    """norm output y (B, T, d) -> y (1 + scale) + shift per time segment: `mod` (B, S, K, d) holds one
    modulation per segment (the leading spans of the given lengths, then `groups` equal ones); as
    broadcasts over views, never one copy per token. Float32 math."""
    head, groups = segments
    out, start = [], 0
    for i, length in enumerate(head):
        out.append(y[:, start:start + length].float() * (1 + mod[:, i:i + 1, scale]) + mod[:, i:i + 1, shift])
        start += length
    if groups:
        rest = y[:, start:].float().unflatten(1, (groups, -1))
        m = mod[:, len(head):, None]
        out.append((rest * (1 + m[..., scale, :]) + m[..., shift, :]).flatten(1, 2))
    return torch.cat(out, dim=1).to(y.dtype) if len(out) > 1 else out[0].to(y.dtype)


def gated(y: torch.Tensor, mod: torch.Tensor, segments: tuple[tuple[int, ...], int], gate: int) -> torch.Tensor:
    """y (B, T, d) times the segment's gate (float32 math, y's dtype out)."""
    head, groups = segments
    out, start = [], 0
    for i, length in enumerate(head):
        out.append(y[:, start:start + length].float() * mod[:, i:i + 1, gate])
        start += length
    if groups:
        out.append((y[:, start:].float().unflatten(1, (groups, -1)) * mod[:, len(head):, None, gate]).flatten(1, 2))
    return (torch.cat(out, dim=1) if len(out) > 1 else out[0]).to(y.dtype)


class Layout:
    """What every block reads besides its tensors: the sequence, the attention kernel and the RoPE
    tables. A plain object, not a dataclass or tuple, so FSDP2's input casting leaves it alone (the
    tables stay float32 under a bf16 policy) and a block's arguments stay few."""

    def __init__(self, seq: TokenSequence, kernel: str, rope: tuple[torch.Tensor, torch.Tensor]):
        self.seq, self.kernel, self.rope = seq, kernel, rope


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.norm_q, self.norm_k = RMSNorm(d, eps), RMSNorm(d, eps)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.norm_q(self.q(x)).view(b, t, self.heads, -1), *layout.rope)
        k = apply_rope(self.norm_k(self.k(x)).view(b, t, self.heads, -1), *layout.rope)
        v = self.v(x).view(b, t, self.heads, -1)
        return self.o(block_causal_attention(q, k, v, layout.seq, layout.kernel))


class CrossAttention(nn.Module):
    """Wan's I2V cross-attention: text and image keys each with their own softmax, outputs summed."""

    def __init__(self, d: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.k_img, self.v_img = nn.Linear(d, d), nn.Linear(d, d)
        self.norm_q, self.norm_k, self.norm_k_img = RMSNorm(d, eps), RMSNorm(d, eps), RMSNorm(d, eps)

    def forward(self, x: torch.Tensor, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        b, h = x.shape[0], self.heads
        heads = lambda z: z.view(b, z.shape[1], h, -1).transpose(1, 2)  # noqa: E731
        q = heads(self.norm_q(self.q(x)))
        out = F.scaled_dot_product_attention(q, heads(self.norm_k(self.k(text))), heads(self.v(text)))
        out = out + F.scaled_dot_product_attention(q, heads(self.norm_k_img(self.k_img(image))), heads(self.v_img(image)))
        return self.o(out.transpose(1, 2).flatten(2))


class WanBlock(nn.Module):
    """One DiT block in Wan's original layout (module docstring)."""

    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        d, eps = cfg.dim, cfg.eps
        self.norm1 = nn.LayerNorm(d, eps=eps, elementwise_affine=False)
        self.self_attn = SelfAttention(d, cfg.heads, eps)
        self.norm3 = nn.LayerNorm(d, eps=eps)
        self.cross_attn = CrossAttention(d, cfg.heads, eps)
        self.norm2 = nn.LayerNorm(d, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(d, cfg.ffn), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn, d))
        self.modulation = nn.Parameter(torch.empty(1, 6, d))

    def forward(self, x: torch.Tensor, e0: torch.Tensor, text: torch.Tensor, image: torch.Tensor,
                layout: Layout) -> torch.Tensor:
        """x (B, T, d); e0 (B, S, 6, d): the time projection of each segment."""
        mod = self.modulation.float()[:, None] + e0.float()  # (B, S, 6, d): shift, scale, gate; then for the FFN
        segs = layout.seq.segments
        y = self.self_attn(segmented(self.norm1(x), mod, segs, 0, 1), layout)
        x = x + gated(y, mod, segs, 2)
        x = x + self.cross_attn(self.norm3(x), text, image)
        y = self.ffn(segmented(self.norm2(x), mod, segs, 3, 4))
        return x + gated(y, mod, segs, 5)


class Head(nn.Module):
    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        d = cfg.dim
        self.norm = nn.LayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(d, cfg.patch_channels)
        self.modulation = nn.Parameter(torch.empty(1, 2, d))

    def forward(self, x: torch.Tensor, e: torch.Tensor, segments: tuple[tuple[int, ...], int]) -> torch.Tensor:
        """x (B, T, d), e (B, S, d) float32: the time embedding of each segment."""
        mod = self.modulation.float()[:, None] + e[:, :, None]  # (B, S, 2, d): shift, scale
        return self.head(segmented(self.norm(x), mod, segments, 0, 1))


class DreamZero(nn.Module):
    """DreamZero's action-conditioned Wan DiT. Block list: `blocks` (BLOCK_LISTS); the embeddings,
    head and action/state MLPs are the root's."""

    BLOCK_LISTS = ("blocks",)
    FROZEN: tuple[str, ...] = ()

    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        self.cfg = cfg
        self.seq = TokenSequence.of(cfg)
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, d, kernel_size=cfg.patch, stride=cfg.patch)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_width, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.img_emb = nn.Module()
        self.img_emb.proj = nn.Sequential(nn.LayerNorm(cfg.image_width), nn.Linear(cfg.image_width, cfg.image_width),
                                          nn.GELU(), nn.Linear(cfg.image_width, d), nn.LayerNorm(d))
        self.blocks = nn.ModuleList(WanBlock(cfg) for _ in range(cfg.depth))
        self.head = Head(cfg)
        self.state_encoder = CategoryMLP(cfg.state_dim, cfg.mlp_hidden, d)
        self.action_encoder = ActionEncoder(cfg.action_dim, d)
        self.action_decoder = CategoryMLP(d, cfg.mlp_hidden, cfg.action_dim)
        if cfg.lora_rank:
            self.requires_grad_(False)  # LoRA: the DiT's base frozen, the action/state MLPs trained in full
            apply_lora(self, suffix_targets(self.blocks, cfg.lora_targets, "blocks."), cfg.lora_rank, cfg.lora_alpha)
            for m in (self.state_encoder, self.action_encoder, self.action_decoder):
                m.requires_grad_(True)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialise every parameter from the global torch RNG, as DreamZero's init_weights: linears
        Xavier-uniform with zero bias, the patch embedding Xavier on its flattened kernel, the text and
        time MLPs N(0, 0.02), the head's output zero, modulations N(0, 1/dim) (Wan), category-specific
        weights N(0, 0.02^2) with zero bias, norms 1 / 0, LoRA A kaiming, B zero. Works after `to_empty()`."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)) and getattr(module, "weight", None) is not None:
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, CategoryLinear):
                nn.init.normal_(module.W, std=0.02)
                nn.init.zeros_(module.b)
        w = self.patch_embedding.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch_embedding.bias)
        for seq in (self.text_embedding, self.time_embedding):
            for m in seq:
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.head.head.weight)
        d = self.cfg.dim
        for block in self.blocks:
            nn.init.normal_(block.modulation, std=d ** -0.5)
        nn.init.normal_(self.head.modulation, std=d ** -0.5)
        init_lora(self)

    # --- pieces ------------------------------------------------------------------------------------
    def embed_video(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """(B, C, F, H, W) latents (+ the conditioning channels) -> (B, F * h * w, d) tokens."""
        dtype = self.patch_embedding.weight.dtype
        x = torch.cat([x, cond], dim=1) if self.cfg.first_frame_concat else x
        return self.patch_embedding(x.to(dtype)).flatten(2).transpose(1, 2)

    def time(self, timesteps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """timesteps (B, S) on the 0..1000 scale -> (e (B, S, d), e0 (B, S, 6, d)), float32."""
        dtype = self.time_embedding[0].weight.dtype
        e = self.time_embedding(time_features(timesteps, self.cfg.freq_dim).to(dtype))
        e0 = self.time_projection(e).unflatten(-1, (6, self.cfg.dim))
        return e.float(), e0.float()

    def context(self, text: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.text_embedding[0].weight.dtype
        return self.text_embedding(text.to(dtype)), self.img_emb.proj(image.to(dtype))

    def run_blocks(self, x: torch.Tensor, e0: torch.Tensor, text: torch.Tensor, image: torch.Tensor,
                   seq: TokenSequence) -> torch.Tensor:
        rope = rope_tables(seq, self.cfg.grid, self.cfg.head_dim, self.cfg.rope_theta, x.device)
        layout = Layout(seq, "dense" if seq.plain else self.cfg.attention, rope)
        for block in self.blocks:
            x = block(x, e0, text, image, layout)
        return x

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, F, H, W) -> (B, F, h * w, ph * pw * C): the head's output layout (Wan's unpatchify inverted)."""
        b, c, f, h, w = x.shape
        _, ph, pw = self.cfg.patch
        x = x.reshape(b, c, f, h // ph, ph, w // pw, pw).permute(0, 2, 3, 5, 4, 6, 1)
        return x.reshape(b, f, (h // ph) * (w // pw), ph * pw * c)

    def unpatchify(self, tokens: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """(B, F, h * w, ph * pw * C) -> (B, C, F, H, W)."""
        b, f = tokens.shape[:2]
        (_, ph, pw), (h, w) = self.cfg.patch, hw
        x = tokens.reshape(b, f, h // ph, w // pw, ph, pw, -1).permute(0, 6, 1, 2, 4, 3, 5)
        return x.reshape(b, -1, f, h, w)

    # --- the two forwards ---------------------------------------------------------------------------
    def velocities(self, batch: DreamZeroBatch, video_x_t: torch.Tensor | None = None,
                   action_x_t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher forcing: (video velocity (B, F, h*w, ph*pw*C), action velocity (B, horizon, action_dim),
        the video target's clean latents patchified like the velocity), fp32, at each frame's sigma
        `batch.sigma` (actions and states at their block's). `video_x_t` (B, C, F, H, W) and `action_x_t`
        given (the sampler), the batch's noise and actions are not read; None: the training points
        (1 - sigma) x + sigma noise."""
        cfg, seq = self.cfg, self.seq
        n, fpb, apb, spb = cfg.blocks, cfg.frames_per_block, cfg.actions_per_block, cfg.states_per_block
        x0 = batch.latents.float()
        sigma = batch.sigma.float()
        block_sigma = sigma[:, 1::fpb]  # (B, n)
        if video_x_t is None:
            s = sigma[:, None, :, None, None]
            video_x_t = (1 - s) * x0 + s * batch.noise.float()
        action_sigma = block_sigma.repeat_interleave(apb, dim=1)[..., None]
        if action_x_t is None:
            action_x_t = (1 - action_sigma) * batch.actions.float() + action_sigma * batch.action_noise.float()
        steps = cfg.train_timesteps
        dtype = self.patch_embedding.weight.dtype

        clean = self.embed_video(x0, batch.cond)
        noisy = self.embed_video(video_x_t, batch.cond).unflatten(1, (cfg.latent_frames, -1))  # (B, F, hw, d)
        b = clean.shape[0]
        acts = self.action_encoder(action_x_t.to(dtype), (action_sigma[..., 0] * steps)).view(b, n, apb, -1)
        states = self.state_encoder(batch.state.to(dtype)).view(b, n, spb, -1)
        groups = torch.cat([noisy[:, 1:].reshape(b, n, fpb * noisy.shape[2], -1), acts, states], dim=2)
        x = torch.cat([clean, noisy[:, 0], groups.flatten(1, 2)], dim=1)

        seg_t = torch.cat([torch.zeros_like(sigma[:, :1]), sigma[:, :1], block_sigma], dim=1) * steps  # (B, n + 2)
        e, e0 = self.time(seg_t)
        text, image = self.context(batch.text, batch.image)
        x = self.run_blocks(x, e0, text, image, seq)

        video = x[:, token_index(seq, "noisy_video_index", x.device)]
        pred_v = self.head(video, e[:, 1:], ((cfg.tokens_per_frame,), n)).float()
        pred_a = self.action_decoder(x[:, token_index(seq, "action_index", x.device)]).float()
        return pred_v.unflatten(1, (cfg.latent_frames, -1)), pred_a, self.patchify(x0)

    def forward(self, batch: DreamZeroBatch,
                per_item: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Scalar loss (fp32): video MSE per frame x its step's weight + masked action MSE x its block's
        weight; `per_item`: (that loss, each sample's (B,) share of it, detached), for the per-source loss."""
        pred_v, pred_a, x0 = self.velocities(batch)
        target_v = self.patchify(batch.noise.float()) - x0
        video = ((pred_v - target_v) ** 2).mean(dim=(2, 3)) * batch.weight.float()
        apb = self.cfg.actions_per_block
        action_w = batch.weight.float()[:, 1::self.cfg.frames_per_block].repeat_interleave(apb, dim=1)
        err = (pred_a - (batch.action_noise.float() - batch.actions.float())) ** 2 * batch.action_mask.float()
        per_sample = video.mean(dim=1) + (err.mean(dim=2) * action_w).mean(dim=1)  # (B,): their mean is the loss
        loss = video.mean() + (err.mean(dim=2) * action_w).mean()
        return (loss, per_sample.detach()) if per_item else loss

    def wan(self, x_t: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, image: torch.Tensor,
            cond: torch.Tensor) -> torch.Tensor:
        """Plain Wan: the DiT over noisy latents x_t (B, C, F, H, W) at one timestep per sample (B,)
        (0..1000), dense attention, no action or state token -> the velocity (B, C, F, H, W), fp32."""
        seq = TokenSequence.of(self.cfg, plain=True)
        x = self.embed_video(x_t, cond)
        e, e0 = self.time(timestep[:, None].float())
        txt, img = self.context(text, image)
        x = self.run_blocks(x, e0, txt, img, seq)
        out = self.head(x, e, seq.segments).float()
        return self.unpatchify(out.unflatten(1, (x_t.shape[2], -1)), x_t.shape[-2:])


@torch.no_grad()
def sample_actions(model: nn.Module, batch: DreamZeroBatch, video_noise: torch.Tensor, action_noise: torch.Tensor,
                   steps: int = SAMPLE_STEPS) -> torch.Tensor:
    """DreamZero's joint sampler on the teacher-forcing sequence: the noisy latent frames and actions
    of every block from noise (sigma 1) to 0 in `steps` Euler steps over the shifted schedule
    (sigma_k = shift s / (1 + (shift - 1) s), s = 1 - k / steps), every frame at the same sigma;
    each block sees the clean latents before it (its observations, as in a rollout with the camera's
    frames in the KV cache). Returns the normalised action chunk (B, horizon, action_dim) fp32; the
    batch's actions, noise and sigma are not read."""
    cfg = model.cfg
    grid = sigmas(steps, cfg.shift).tolist() + [0.0]
    xv, xa = video_noise.float(), action_noise.float()
    b, f = xv.shape[0], xv.shape[2]
    for k in range(steps):
        s = torch.full((b, f), grid[k], dtype=torch.float32, device=xa.device)
        pred_v, pred_a, _ = model.velocities(replace(batch, sigma=s), xv, xa)
        dt = grid[k + 1] - grid[k]
        xv = xv + dt * model.unpatchify(pred_v, xv.shape[-2:])
        xa = xa + dt * pred_a
    return xa

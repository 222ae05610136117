"""The `dreamzero` model family: a DreamZero-shaped world-action model (random init), after Wan 2.2.

Video (B, F, 3, H, W), normalised -> `vae` (a frozen stand-in: a fixed random linear map of each
(4, 16, 16) pixel patch to 48 channels at 5b: Wan's VAE stride and channels, not its weights) ->
latents -> DiT tokens (patch (1, 2, 2)). Context: `text_encoder` (a frozen random embedding of the
task's UTF-8 bytes, 512 x 4096, in place of umT5) and `image_encoder` (a frozen random patch
projection of the conditioning canvas, 257 x 1280, in place of CLIP), each then projected by a
trained MLP to the DiT width, as Wan does. No weights are downloaded; the stand-ins cost what a
cheap encoder costs, not what umT5/CLIP/the VAE cost (they are frozen, so they do not train).

The sequence is DreamZero's teacher forcing (sequence.py): clean latent frames, their noisy copies
per action block, the noisy action chunk of each block, and the state tokens. `blocks` are Wan
DiT blocks: adaLN modulation (shift, scale, gate for attention and MLP) from the flow time of each
token's segment (clean: time 0; block i's noisy frames and actions: the block's time, so the
action's flow time is tied to its block's video time), self-attention with RMSNorm on q and k,
block-causal (attention.py), cross-attention to the context, GELU MLP. adaLN-zero: the shared
time projection starts at zero; each block adds its own learned modulation table (Wan's,
N(0, 1/dim)), so a block's gates start small, not zero (no all-zero GEMM operand in backward).
Flow matching: x_t = t * noise + (1 - t) * x, target noise - x; loss = video MSE (noisy frames)
+ action MSE (actions decoded by a small MLP). Noise and time come in the batch (host-drawn).
At inference `sample_actions` denoises every block's latent frames and actions together from t = 1
to t = 0 in `SAMPLE_STEPS` Euler steps (DreamZero's 16 steps, on a uniform time grid: the stand-in
trains on uniform times, so neither Wan's shifted schedule nor guidance is used).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainkit.models.dreamzero.attention import block_causal_attention
from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.sequence import TokenSequence
from trainkit.models.layers import RMSNorm


@dataclass
class DreamZeroBatch:
    """One micro-batch; B samples, n = cfg.blocks action blocks."""
    video: torch.Tensor | None  # (B, F, 3, H, W) float, normalised canvas frames (None: from a feature folder)
    tokens: torch.Tensor | None  # (B, text_len) int64 text tokens (UTF-8 bytes + 1, 0 = padding)
    state: torch.Tensor        # (B, state_tokens, state_dim) float32, normalised, zero-padded
    actions: torch.Tensor      # (B, n, actions_per_block, action_dim) float32, normalised, zero-padded
    video_noise: torch.Tensor  # (B, n * frames_per_block, tokens_per_frame, patch_channels) float32
    action_noise: torch.Tensor  # like actions, float32
    time: torch.Tensor         # (B, n) float32 flow time of each block, in (0, 1)
    # from a feature folder (`datakit encode`), in place of the frozen stand-ins' outputs:
    latents: torch.Tensor | None = None  # (B, latent_channels, latent frames, h, w): the cached VAE latents
    text: torch.Tensor | None = None  # (B, text_len, text_width): cached text embeddings, zero-padded
    image: torch.Tensor | None = None  # (B, image tokens, image_width): cached first-frame image features

    def to(self, device: torch.device | str, non_blocking: bool = True) -> DreamZeroBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device, non_blocking=non_blocking) for k, v in moved.items() if v is not None})


SAMPLE_STEPS = 16  # Euler steps of the sampler: DreamZero's WANPolicyHead default num_inference_steps


@torch.no_grad()
def sample_actions(model: nn.Module, batch: DreamZeroBatch, video_noise: torch.Tensor, action_noise: torch.Tensor,
                   steps: int = SAMPLE_STEPS) -> torch.Tensor:
    """DreamZero's joint sampler on the teacher-forcing sequence: from noise at t = 1, `steps` Euler
    steps to t = 0 of the noisy latent frames and actions of every block together (each block sees
    the clean frames before it: its observations, as in a rollout with the camera's frames in the
    KV cache), dt = -1/steps, t_i = 1 + i dt for every block. Returns the normalised action chunk
    (B, horizon, action_dim) fp32, the blocks in order. The batch's actions, noise and time are not read."""
    dt = -1.0 / steps
    xv, xa = video_noise.float(), action_noise.float()
    for i in range(steps):
        t = torch.full(batch.time.shape, 1.0 + i * dt, dtype=torch.float32, device=xa.device)
        pred_v, pred_a, _ = model.velocities(replace(batch, time=t), xv, xa)
        xv, xa = xv + dt * pred_v.view_as(xv), xa + dt * pred_a
    return xa.flatten(1, 2)


def time_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features (..., dim) of flow time in [0, 1] (Wan's sinusoidal_embedding_1d on 1000 t)."""
    half = dim // 2
    freq = torch.pow(10_000.0, -torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angle = (1000.0 * t.float())[..., None] * freq
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


class VideoPatchify(nn.Module):
    """The frozen VAE stand-in: (B, F, 3, H, W) -> (B, latent frames, h, w, channels). Frame 0 is
    encoded alone (repeated to the temporal stride), then every `stride[0]` frames, as Wan's causal VAE."""

    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        self.stride = cfg.vae_stride
        self.proj = nn.Linear(cfg.vae_patch, cfg.latent_channels, bias=False)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        st, sh, sw = self.stride
        b, f, c, h, w = video.shape
        x = torch.cat([video[:, :1].expand(b, st, c, h, w), video[:, 1:]], dim=1)  # (B, Lf * st, 3, H, W)
        x = x.reshape(b, -1, st, c, h // sh, sh, w // sw, sw).permute(0, 1, 4, 6, 2, 3, 5, 7)
        return self.proj(x.flatten(4).to(self.proj.weight.dtype))


class TextStandIn(nn.Module):
    """The frozen text-encoder stand-in: token ids -> (B, text_len, text_width)."""

    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.text_vocab, cfg.text_width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens)


class ImageStandIn(nn.Module):
    """The frozen image-encoder stand-in: the conditioning canvas (B, 3, H, W) -> a class token and
    grid^2 patch tokens (B, grid^2 + 1, image_width) by one linear map of each patch."""

    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        self.grid = cfg.image_grid
        h, w = cfg.canvas
        self.proj = nn.Linear(3 * (h // cfg.image_grid) * (w // cfg.image_grid), cfg.image_width, bias=False)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.image_width))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        b, c, h, w = image.shape
        g = self.grid
        x = image.reshape(b, c, g, h // g, g, w // g).permute(0, 2, 4, 1, 3, 5).flatten(3).flatten(1, 2)
        x = self.proj(x.to(self.proj.weight.dtype))
        return torch.cat([self.cls.expand(b, -1, -1).to(x.dtype), x], dim=1)


def per_segment(y: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None, clean: int) -> torch.Tensor:
    """y * scale (+ shift) with one (scale, shift) per flow-time segment: (B, segments, dim) each,
    segment 0 for the first `clean` tokens, segment i for the i-th equal part of the rest. Done
    as broadcasts over the two views (no per-token copy of the modulation)."""
    head, rest = y[:, :clean] * scale[:, :1], y[:, clean:].unflatten(1, (scale.shape[1] - 1, -1)) * scale[:, 1:, None]
    if shift is not None:
        head, rest = head + shift[:, :1], rest + shift[:, 1:, None]
    return torch.cat([head, rest.flatten(1, 2)], dim=1)


class WanBlock(nn.Module):
    """One DiT block: modulated self-attention (qk RMSNorm, block-causal), cross-attention to the
    context, modulated GELU MLP; `time_mod` (B, segments, 6, dim) is the time modulation of each
    flow-time segment (clean, then one per action block)."""

    def __init__(self, cfg: DreamZeroConfig, seq: TokenSequence):
        super().__init__()
        d, self.heads, self.seq, self.kernel = cfg.dim, cfg.heads, seq, cfg.attention
        self.modulation = nn.Parameter(torch.zeros(1, 1, 6, d))
        self.norm1 = nn.LayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.qkv = nn.Linear(d, 3 * d)
        self.norm_q, self.norm_k = RMSNorm(d, cfg.eps), RMSNorm(d, cfg.eps)
        self.o = nn.Linear(d, d)
        self.norm_x = nn.LayerNorm(d, eps=cfg.eps)  # before cross-attention (Wan's cross_attn_norm)
        self.cross_q, self.cross_kv, self.cross_o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.norm_cq, self.norm_ck = RMSNorm(d, cfg.eps), RMSNorm(d, cfg.eps)
        self.norm2 = nn.LayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.up, self.down = nn.Linear(d, cfg.ffn), nn.Linear(cfg.ffn, d)

    def forward(self, x: torch.Tensor, context: torch.Tensor, time_mod: torch.Tensor) -> torch.Tensor:
        """x (B, T, dim), context (B, C, dim), time_mod (B, segments, 6, dim)."""
        b, t, d = x.shape
        h, clean = self.heads, self.seq.clean
        mod = (self.modulation + time_mod).to(x.dtype)  # (B, segments, 6, dim)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.unbind(2)
        y = per_segment(self.norm1(x), 1 + scale_a, shift_a, clean)
        q, k, v = self.qkv(y).chunk(3, dim=-1)
        q, k = self.norm_q(q), self.norm_k(k)
        a = block_causal_attention(q.view(b, t, h, -1), k.view(b, t, h, -1), v.view(b, t, h, -1), self.seq,
                                   self.kernel)
        x = x + per_segment(self.o(a), gate_a, None, clean)
        cq = self.norm_cq(self.cross_q(self.norm_x(x))).view(b, t, h, -1).transpose(1, 2)
        ck, cv = self.cross_kv(context).chunk(2, dim=-1)
        ck = self.norm_ck(ck).view(b, -1, h, d // h).transpose(1, 2)
        a = F.scaled_dot_product_attention(cq, ck, cv.view(b, -1, h, d // h).transpose(1, 2))
        x = x + self.cross_o(a.transpose(1, 2).reshape(b, t, d))
        y = per_segment(self.norm2(x), 1 + scale_m, shift_m, clean)
        return x + per_segment(self.down(F.gelu(self.up(y), approximate="tanh")), gate_m, None, clean)


class DreamZero(nn.Module):
    """DreamZero-shaped world-action model. Block lists: the frozen stand-ins `vae`, `text_encoder`,
    `image_encoder` (one module each) and the trained DiT `blocks` (BLOCK_LISTS)."""

    BLOCK_LISTS = ("vae", "text_encoder", "image_encoder", "blocks")
    FROZEN = ("vae", "text_encoder", "image_encoder")

    def __init__(self, cfg: DreamZeroConfig):
        super().__init__()
        self.cfg = cfg
        self.seq = seq = TokenSequence.of(cfg)
        d = cfg.dim
        self.vae = nn.ModuleList([VideoPatchify(cfg)])
        self.text_encoder = nn.ModuleList([TextStandIn(cfg)])
        self.image_encoder = nn.ModuleList([ImageStandIn(cfg)])
        self.patch_embed = nn.Linear(cfg.patch_channels, d)
        self.pos_frame = nn.Parameter(torch.zeros(cfg.latent_frames, 1, d))
        self.pos_space = nn.Parameter(torch.zeros(cfg.tokens_per_frame, d))
        self.pos_action = nn.Parameter(torch.zeros(cfg.actions_per_block, d))
        self.pos_state = nn.Parameter(torch.zeros(cfg.state_tokens, d))
        self.action_in = nn.Linear(cfg.action_dim, d)
        self.state_in = nn.Linear(cfg.state_dim, d)
        self.text_proj = nn.Sequential(nn.Linear(cfg.text_width, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.image_proj = nn.Sequential(nn.LayerNorm(cfg.image_width), nn.Linear(cfg.image_width, d), nn.GELU(),
                                        nn.Linear(d, d), nn.LayerNorm(d))
        self.time_embed = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_proj = nn.Linear(d, 6 * d)  # adaLN-zero: zero at init
        self.blocks = nn.ModuleList(WanBlock(cfg, seq) for _ in range(cfg.depth))
        self.head_modulation = nn.Parameter(torch.zeros(1, 1, 2, d))
        self.head_norm = nn.LayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(d, cfg.patch_channels)
        self.action_out = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, cfg.action_dim))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialise every parameter from the global torch RNG, in module order: matrices
        N(0, 0.02), biases 0, norm scales 1, the time projection 0 (adaLN-zero), modulation tables
        N(0, 1/dim) (Wan), position tables N(0, 0.02); the frozen stand-ins N(0, 1/fan_in) (text:
        N(0, 1)), so latents and context have unit scale. Works after `to_empty()` from meta."""
        frozen = {id(m) for name in self.FROZEN for m in getattr(self, name).modules()}
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if module is self.time_proj:
                    nn.init.zeros_(module.weight)
                else:
                    std = module.in_features ** -0.5 if id(module) in frozen else 0.02
                    nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=1.0)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)) and getattr(module, "weight", None) is not None:
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        d = self.cfg.dim
        for block in self.blocks:
            nn.init.normal_(block.modulation, std=d ** -0.5)
        nn.init.normal_(self.head_modulation, std=d ** -0.5)
        for p in (self.pos_frame, self.pos_space, self.pos_action, self.pos_state, self.image_encoder[0].cls):
            nn.init.normal_(p, std=0.02)

    def video_tokens(self, batch: DreamZeroBatch) -> torch.Tensor:
        """The clip's frames (B, F, 3, H, W) through the VAE stand-in, or its cached latents (B, C, Lf,
        h, w) -> latent patch tokens (B, latent frames, tokens_per_frame, patch_channels)."""
        _, ph, pw = self.cfg.patch
        if batch.latents is not None:
            lat = batch.latents.permute(0, 2, 3, 4, 1)  # (B, Lf, h, w, C)
        else:
            lat = self.vae[0](batch.video)  # (B, Lf, h, w, C)
        b, lf, h, w, c = lat.shape
        lat = lat.reshape(b, lf, h // ph, ph, w // pw, pw, c).permute(0, 1, 2, 4, 6, 3, 5)
        return lat.reshape(b, lf, (h // ph) * (w // pw), c * ph * pw)

    def velocities(self, batch: DreamZeroBatch, video_x_t: torch.Tensor | None = None,
                   action_x_t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(video velocity (B, n, fpb x tpf, patch_channels), action velocity (B, n, apb, action_dim),
        the clean latent tokens of blocks 1..n (B, n x fpb, tpf, patch_channels)), fp32, at the noisy
        latents and actions given and each block's time `batch.time`; None: the training points
        t * noise + (1 - t) * x (given, the batch's noise and actions are not read: the sampler's case)."""
        cfg = self.cfg
        n, fpb, tpf = cfg.blocks, cfg.frames_per_block, cfg.tokens_per_frame
        dtype = self.patch_embed.weight.dtype
        x0 = self.video_tokens(batch).float()  # (B, Lf, tpf, P): clean latent tokens
        b = x0.shape[0]
        target = x0[:, 1:]
        if video_x_t is None:
            t_frames = batch.time.float().repeat_interleave(fpb, dim=1)[:, :, None, None]  # (B, n * fpb, 1, 1)
            video_x_t = t_frames * batch.video_noise.float() + (1 - t_frames) * target
        if action_x_t is None:
            t_act = batch.time.float()[:, :, None, None]
            action_x_t = t_act * batch.action_noise.float() + (1 - t_act) * batch.actions.float()

        pos = self.pos_frame + self.pos_space  # (Lf, tpf, dim)
        clean = self.patch_embed(x0.to(dtype)) + pos  # (B, Lf, tpf, dim)
        noisy = (self.patch_embed(video_x_t.to(dtype)) + pos[1:]).view(b, n, fpb * tpf, -1)
        acts = self.action_in(action_x_t.to(dtype)) + self.pos_action  # (B, n, apb, dim)
        state = self.state_in(batch.state.to(dtype)) + self.pos_state
        x = torch.cat([clean[:, 0], state, clean[:, 1:].flatten(1, 2),
                       torch.cat([noisy, acts], dim=2).flatten(1, 2)], dim=1)

        image = batch.image if batch.image is not None else self.image_encoder[0](batch.video[:, 0])
        text = batch.text if batch.text is not None else self.text_encoder[0](batch.tokens)
        context = torch.cat([self.image_proj(image.to(dtype)), self.text_proj(text.to(dtype))], dim=1)
        seg_time = torch.cat([torch.zeros_like(batch.time[:, :1]), batch.time], dim=1).float()  # (B, n + 1)
        e = self.time_embed(time_features(seg_time, cfg.freq_dim).to(dtype))  # (B, n + 1, dim)
        time_mod = self.time_proj(F.silu(e)).unflatten(-1, (6, cfg.dim))  # (B, n + 1, 6, dim)
        for block in self.blocks:
            x = block(x, context, time_mod)

        out = x[:, self.seq.clean:].view(b, n, self.seq.noisy_block, -1)
        shift, scale = (self.head_modulation + e[:, 1:, None]).unsqueeze(2).unbind(3)  # (B, n, 1, dim) each
        video = out[:, :, :fpb * tpf]
        pred_v = self.head(self.head_norm(video) * (1 + scale) + shift).float()
        return pred_v, self.action_out(out[:, :, fpb * tpf:]).float(), target

    def forward(self, batch: DreamZeroBatch,
                per_item: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Scalar loss (fp32): video flow-matching MSE + action flow-matching MSE; `per_item`: (that
        loss, each sample's (B,) video + action MSE, detached), for the per-source loss."""
        pred_v, pred_a, target = self.velocities(batch)
        target_v = (batch.video_noise.float() - target).view_as(pred_v)
        target_a = batch.action_noise.float() - batch.actions.float()
        loss = F.mse_loss(pred_v, target_v) + F.mse_loss(pred_a, target_a)
        if not per_item:
            return loss
        return loss, ((pred_v.detach() - target_v).square().flatten(1).mean(1)
                      + (pred_a.detach() - target_a).square().flatten(1).mean(1))

"""Stand-in features for frame shards: what the `dreamzero` family trains on when the data is frames,
not a `datakit encode` feature folder (CPU tests, smoke runs, GPU benches without the encoders).

Fixed random linear maps at the real shapes, drawn once from their own seed (never the training
RNG, so every run and rank has the same ones): the VAE (each (4, 16, 16) pixel patch -> 48 channels
at 5b; the first frame alone, repeated to the temporal stride, as Wan's causal VAE), umT5 (an
embedding of the task's UTF-8 bytes, 4096 wide) and CLIP (a class token and grid^2 patch tokens of
the first canvas frame, 1280 wide). They cost a few small matmuls, not the encoders' FLOPs, and
they carry no knowledge: the real features come from the cache.
"""
from __future__ import annotations

import torch

from trainkit.models.dreamzero.config import DreamZeroConfig

SEED = 20_260_431


class StandIns:
    """The three maps, on the CPU; `to(device)` once per device."""

    def __init__(self, cfg: DreamZeroConfig):
        self.cfg = cfg
        g = torch.Generator().manual_seed(SEED)
        ch, cw = cfg.canvas
        patch = 3 * (ch // cfg.image_grid) * (cw // cfg.image_grid)
        self.vae = torch.randn(cfg.vae_patch, cfg.latent_channels, generator=g) * cfg.vae_patch ** -0.5
        self.text = torch.randn(cfg.text_vocab, cfg.text_width, generator=g)
        self.image = torch.randn(patch, cfg.image_width, generator=g) * patch ** -0.5
        self.cls = torch.randn(1, cfg.image_width, generator=g)
        self._on: dict[str, tuple[torch.Tensor, ...]] = {}

    def _maps(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        key = str(device)
        if key not in self._on:
            self._on[key] = tuple(t.to(device) for t in (self.vae, self.text, self.image, self.cls))
        return self._on[key]

    def latents(self, video: torch.Tensor) -> torch.Tensor:
        """(B, frames, 3, H, W) -> (B, C, latent frames, H / 16, W / 16) float32."""
        vae = self._maps(video.device)[0]
        st, sh, sw = self.cfg.vae_stride
        b, f, c, h, w = video.shape
        x = torch.cat([video[:, :1].expand(b, st, c, h, w), video[:, 1:]], dim=1).float()
        x = x.reshape(b, -1, st, c, h // sh, sh, w // sw, sw).permute(0, 1, 4, 6, 2, 3, 5, 7).flatten(4)
        return (x @ vae).permute(0, 4, 1, 2, 3)

    def text_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, text_len) byte ids (0 = padding) -> (B, text_len, text_width), zero at the padding (Wan's)."""
        table = self._maps(tokens.device)[1]
        return table[tokens] * (tokens > 0)[..., None]

    def image_features(self, frame: torch.Tensor) -> torch.Tensor:
        """The first canvas frame (B, 3, H, W) -> (B, grid^2 + 1, image_width)."""
        _, _, proj, cls = self._maps(frame.device)
        b, c, h, w = frame.shape
        g = self.cfg.image_grid
        x = frame.float().reshape(b, c, g, h // g, g, w // g).permute(0, 2, 4, 1, 3, 5).flatten(3).flatten(1, 2)
        return torch.cat([cls.expand(b, 1, -1), x @ proj], dim=1)


def first_frame_cond(latents: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
    """Wan2.1-I2V's conditioning y (B, 4 + C, F, H, W): 4 mask channels (1 on latent frame 0: the
    first video frame's 4 mask slots) then the VAE latents of [first frame, zeros...]: latent frame
    0 (the first frame alone, the same as the clip's) and `cond` for frames 1.. (the cache's
    cond_latents; None: zeros, the frame path's stand-in of a zero video)."""
    b, c, f, h, w = latents.shape
    mask = torch.zeros(b, 4, f, h, w, dtype=latents.dtype, device=latents.device)
    mask[:, :, 0] = 1
    rest = cond.to(latents.dtype) if cond is not None else latents.new_zeros(b, c, f - 1, h, w)
    return torch.cat([mask, torch.cat([latents[:, :, :1], rest], dim=2)], dim=1)

"""Shapes of the `dreamzero` family: `DreamZeroConfig`, its presets, and the token sequence they imply.

`5b` is Wan-2.2-TI2V-5B's DiT (30 x 3072, 24 heads x 128, FFN 14336, 48 latent channels, VAE stride
(4, 16, 16)) with DreamZero's teacher-forcing sequence; `14b` is Wan-2.1-14B's (40 x 5120, 40 heads,
FFN 13824, 16 latent channels, VAE stride (4, 8, 8)). Video: 33 frames of one 352x640 canvas (three
176x320 views tiled by datakit's loader) -> 9 latent frames (the first alone, then 4 per latent, as
Wan's causal VAE) -> 220 tokens per latent frame at the 5b stride, 880 at the 14b stride (patch
(1, 2, 2)). `tiny` keeps the structure (2 action blocks, the same sequence rules) at small widths for
CPU tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from trainkit.errors import ModelConfigError

Attention = Literal["blocks", "flex", "dense"]


@dataclass(kw_only=True)
class DreamZeroConfig:
    """Every shape of the model. Widths are channels, depths are block counts."""
    dim: int                     # DiT channels (5b: 3072)
    depth: int                   # DiT blocks = len(blocks) (30)
    heads: int                   # attention heads (24; head size = dim / heads)
    ffn: int                     # GELU MLP hidden size (14336)
    latent_channels: int         # VAE latent channels (48)
    vae_stride: tuple[int, int, int]  # VAE (frames, height, width) stride ((4, 16, 16))
    patch: tuple[int, int, int] = (1, 2, 2)  # DiT patch over the latent (frames, height, width)
    frames: int = 33             # video frames per sample (1 + vae_stride[0] * latent frames after the first)
    view: tuple[int, int] = (176, 320)  # one camera view (H, W); the canvas is 2H x 2W (3 views tiled)
    frames_per_block: int = 2    # latent frames per action block (blocks 1..n; block 0 = frame 0 + state)
    actions_per_block: int = 24  # action tokens per block (5b: 4 blocks x 24 = 96)
    state_tokens: int = 4        # state tokens (in block 0): the last `state_tokens` states up to t
    action_dim: int = 32         # action channels (robot actions zero-padded to this)
    state_dim: int = 32          # state channels (zero-padded to this)
    text_len: int = 512          # text context tokens (umT5's 512)
    text_width: int = 4096       # text encoder width (umT5-XXL: 4096)
    text_vocab: int = 257        # the text stand-in's vocabulary: UTF-8 bytes + padding (id 0)
    image_grid: int = 16         # the image stand-in's patch grid: grid^2 + 1 (class) tokens (CLIP: 257)
    image_width: int = 1280      # image encoder width (CLIP ViT-H: 1280)
    freq_dim: int = 256          # sinusoidal flow-time features
    eps: float = 1e-6            # norms' epsilon
    # self-attention kernel: "blocks" = SDPA per block over the keys it sees (no mask, fused
    # kernels), "flex" = FlexAttention with a block mask (CUDA), "dense" = SDPA with a dense mask
    attention: Attention = "blocks"

    def __post_init__(self) -> None:
        self.vae_stride, self.patch, self.view = tuple(self.vae_stride), tuple(self.patch), tuple(self.view)
        ints = ("dim", "depth", "heads", "ffn", "latent_channels", "frames", "frames_per_block", "actions_per_block",
                "state_tokens", "action_dim", "state_dim", "text_len", "text_width", "text_vocab", "image_grid",
                "image_width", "freq_dim")
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"DreamZeroConfig.{name} must be a positive int, got {value!r}")
        if self.attention not in ("blocks", "flex", "dense"):
            raise ModelConfigError(f"DreamZeroConfig.attention {self.attention!r} is not one of blocks, flex, dense")
        if self.dim % self.heads or self.dim % 2:
            raise ModelConfigError(f"DreamZeroConfig.dim {self.dim} must be even and divisible by heads {self.heads}")
        if self.patch[0] != 1:
            raise ModelConfigError(f"DreamZeroConfig.patch {self.patch}: only a temporal patch of 1 is supported")
        st, sh, sw = self.vae_stride
        h, w = self.canvas
        if (self.frames - 1) % st:
            raise ModelConfigError(f"DreamZeroConfig.frames {self.frames} is not 1 + a multiple of vae_stride[0] {st}")
        if h % (sh * self.patch[1]) or w % (sw * self.patch[2]):
            raise ModelConfigError(f"DreamZeroConfig: canvas {h}x{w} is not a multiple of vae_stride x patch")
        if (self.latent_frames - 1) % self.frames_per_block:
            raise ModelConfigError(f"DreamZeroConfig: {self.latent_frames - 1} latent frames after the first do "
                                   f"not split into blocks of frames_per_block={self.frames_per_block}")
        if h % self.image_grid or w % self.image_grid:
            raise ModelConfigError(f"DreamZeroConfig.image_grid {self.image_grid} does not divide the canvas {h}x{w}")

    # --- derived shapes ---------------------------------------------------------------------------
    @property
    def canvas(self) -> tuple[int, int]:
        """The tiled canvas (H, W): 2 x 2 views (datakit.loader.tiling, "wrist_top")."""
        return 2 * self.view[0], 2 * self.view[1]

    @property
    def latent_frames(self) -> int:
        return 1 + (self.frames - 1) // self.vae_stride[0]

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.canvas[0] // self.vae_stride[1], self.canvas[1] // self.vae_stride[2]

    @property
    def tokens_per_frame(self) -> int:
        """DiT tokens per latent frame (220 at 5b, 880 at 14b)."""
        h, w = self.latent_hw
        return (h // self.patch[1]) * (w // self.patch[2])

    @property
    def patch_channels(self) -> int:
        """Latent values per DiT token (channels x patch area)."""
        return self.latent_channels * self.patch[1] * self.patch[2]

    @property
    def vae_patch(self) -> int:
        """Pixel values the VAE stand-in maps to one latent vector (frames x 3 x stride area)."""
        st, sh, sw = self.vae_stride
        return st * 3 * sh * sw

    @property
    def blocks(self) -> int:
        """Action blocks (1..n; 4 at 5b): latent frames after the first / frames_per_block."""
        return (self.latent_frames - 1) // self.frames_per_block

    @property
    def horizon(self) -> int:
        """Actions per sample (96 at 5b)."""
        return self.blocks * self.actions_per_block

    @property
    def image_tokens(self) -> int:
        return self.image_grid ** 2 + 1

    @property
    def context_tokens(self) -> int:
        """Cross-attention context: image tokens + text tokens (257 + 512)."""
        return self.image_tokens + self.text_len

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def preset_5b() -> DreamZeroConfig:
    """Wan-2.2-TI2V-5B-shaped DiT with DreamZero's sequence (about 5B parameters)."""
    return DreamZeroConfig(dim=3072, depth=30, heads=24, ffn=14336, latent_channels=48, vae_stride=(4, 16, 16))


def preset_14b() -> DreamZeroConfig:
    """Wan-2.1-14B-shaped DiT (dim 5120, 40 layers, 40 heads, FFN 13824, 16 latent channels, stride (4, 8, 8))."""
    return DreamZeroConfig(dim=5120, depth=40, heads=40, ffn=13824, latent_channels=16, vae_stride=(4, 8, 8))


def tiny() -> DreamZeroConfig:
    """The structure at small widths: 17 frames of a 64x128 canvas -> 5 latent frames of 8 tokens,
    2 action blocks of 4 actions, 2 state tokens; CPU tests in seconds."""
    return DreamZeroConfig(dim=32, depth=2, heads=4, ffn=64, latent_channels=8, vae_stride=(4, 16, 16), frames=17,
                           view=(32, 64), actions_per_block=4, state_tokens=2, action_dim=8, state_dim=8, text_len=16,
                           text_width=24, image_grid=4, image_width=16, freq_dim=16)


PRESETS: dict[str, Callable[[], DreamZeroConfig]] = {"tiny": tiny, "5b": preset_5b, "14b": preset_14b}

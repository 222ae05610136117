"""Shapes of the `dreamzero` family: `DreamZeroConfig`, its presets, and the token counts they imply.

DreamZero (the official `CausalWanModel`) is a Wan DiT with action and state tokens. `14b` is the
released checkpoints' backbone, Wan2.1-I2V-14B (40 x 5120, 40 heads x 128, FFN 13824; input 36 =
16 noisy latent + 4 mask + 16 first-frame conditioning channels, output 16, VAE stride (4, 8, 8));
`5b` is the optional Wan2.2-TI2V-5B backbone (30 x 3072, 24 heads x 128, FFN 14336, 48 latent
channels in and out, no first-frame concat, VAE stride (4, 16, 16)); both take CLIP image features
through Wan's I2V cross-attention. Video: 33 frames of one 352x640 canvas (three 176x320 views tiled
by datakit's loader) -> 9 latent frames (the first alone, then 4 per latent, as Wan's causal VAE) =
one conditioning frame + 4 blocks of 2 -> 220 tokens per latent frame at the 5b stride, 880 at 14b
(patch (1, 2, 2)); 24 actions and one state per block (DROID). `tiny` keeps the structure at small
widths for CPU tests. A checkpoint's shapes replace the preset's (`model.init_from`, weights.py).
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Callable, Literal

from trainkit.errors import ModelConfigError
from trainkit.models.lora import check_lora_fields

Attention = Literal["blocks", "flex", "dense"]
# DreamZero's LoRA recipe: rank 4, alpha 4, lora_target_modules "q,k,v,o,ffn.0,ffn.2", init "kaiming"
# (github.com/dreamzero0/dreamzero, commit 312b813, groot/vla/configs/model/dreamzero/action_head/
# wan_flow_matching_action_tf.yaml); "k"/"v" adapt self- and cross-attention's, not k_img / v_img
LORA_TARGETS = ("q", "k", "v", "o", "ffn.0", "ffn.2")


@dataclass(kw_only=True)
class DreamZeroConfig:
    """Every shape of the model. Widths are channels, depths are block counts."""
    dim: int                     # DiT channels (5b: 3072)
    depth: int                   # DiT blocks = len(blocks) (30)
    heads: int                   # attention heads (24; head size = dim / heads)
    ffn: int                     # gelu-tanh FFN hidden size (14336)
    latent_channels: int         # VAE latent channels = the DiT's output channels (48; 14b: 16)
    first_frame_concat: bool = False  # Wan2.1-I2V: 4 mask + latent_channels conditioning channels concatenated to the input
    vae_stride: tuple[int, int, int]  # VAE (frames, height, width) stride ((4, 16, 16))
    patch: tuple[int, int, int] = (1, 2, 2)  # DiT patch over the latent (frames, height, width)
    frames: int = 33             # video frames per sample (1 + vae_stride[0] * latent frames after the first)
    view: tuple[int, int] = (176, 320)  # one camera view (H, W); the canvas is 2H x 2W (3 views tiled)
    frames_per_block: int = 2    # latent frames per action block (blocks 1..n after the conditioning frame)
    actions_per_block: int = 24  # action tokens per block (DROID: 24)
    states_per_block: int = 1    # state tokens per block (DreamZero's num_state_per_block)
    action_dim: int = 32         # action channels (robot actions zero-padded to this; DreamZero's max_action_dim)
    state_dim: int = 64          # state channels (zero-padded to this; DreamZero's max_state_dim)
    mlp_hidden: int = 1024       # hidden width of the state encoder and action decoder MLPs (DreamZero's hidden_size)
    text_len: int = 512          # text context tokens (umT5's 512; shorter prompts are zero-padded, as Wan)
    text_width: int = 4096       # text encoder width (umT5-XXL: 4096)
    text_vocab: int = 257        # the frame path's text stand-in vocabulary: UTF-8 bytes + padding (id 0)
    image_grid: int = 16         # the frame path's image stand-in patch grid: grid^2 + 1 tokens (CLIP: 257)
    image_width: int = 1280      # image encoder width (CLIP ViT-H: 1280)
    freq_dim: int = 256          # sinusoidal time features
    eps: float = 1e-6            # norms' epsilon
    rope_theta: float = 10_000.0  # RoPE base (3-D for video, 1-D for actions and states)
    train_timesteps: int = 1000  # discrete flow-matching steps (DreamZero's FlowMatchScheduler)
    shift: float = 5.0           # the schedule's sigma shift
    # self-attention kernel: "blocks" = SDPA per part of the block-causal pattern over the keys it
    # sees (no mask, fused kernels), "flex" = FlexAttention with a block mask (CUDA), "dense" = SDPA with a dense mask
    attention: Attention = "blocks"
    lora_rank: int = 0           # 0: the DiT trains in full; r > 0: LoRA of rank r on lora_targets, the base frozen
    lora_alpha: float = 4.0      # LoRA scale = alpha / rank (DreamZero: rank 4, alpha 4)
    lora_targets: tuple[str, ...] = LORA_TARGETS  # block linears LoRA wraps (names inside a block)

    def __post_init__(self) -> None:
        self.vae_stride, self.patch, self.view = tuple(self.vae_stride), tuple(self.patch), tuple(self.view)
        self.lora_targets = tuple(self.lora_targets)
        ints = ("dim", "depth", "heads", "ffn", "latent_channels", "frames", "frames_per_block", "actions_per_block",
                "states_per_block", "action_dim", "state_dim", "mlp_hidden", "text_len", "text_width", "text_vocab",
                "image_grid", "image_width", "freq_dim", "train_timesteps")
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"DreamZeroConfig.{name} must be a positive int, got {value!r}")
        if self.attention not in ("blocks", "flex", "dense"):
            raise ModelConfigError(f"DreamZeroConfig.attention {self.attention!r} is not one of blocks, flex, dense")
        if self.dim % self.heads or self.head_dim % 2 or self.head_dim < 6:
            raise ModelConfigError(f"DreamZeroConfig.dim {self.dim} / heads {self.heads} must give an even head "
                                   "size of at least 6 (3-D RoPE splits it in three)")
        if self.patch[0] != 1:
            raise ModelConfigError(f"DreamZeroConfig.patch {self.patch}: only a temporal patch of 1 is supported")
        problem = check_lora_fields("DreamZeroConfig", self.lora_rank, self.lora_alpha, self.lora_targets, LORA_TARGETS)
        if problem:
            raise ModelConfigError(problem)
        if self.shift <= 0:
            raise ModelConfigError(f"DreamZeroConfig.shift must be > 0, got {self.shift}")
        st, sh, sw = self.vae_stride
        h, w = self.canvas
        if (self.frames - 1) % st:
            raise ModelConfigError(f"DreamZeroConfig.frames {self.frames} is not 1 + a multiple of vae_stride[0] {st}")
        if h % (sh * self.patch[1]) or w % (sw * self.patch[2]):
            raise ModelConfigError(f"DreamZeroConfig: canvas {h}x{w} is not a multiple of vae_stride x patch")
        if (self.latent_frames - 1) % self.frames_per_block or self.latent_frames == 1:
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
    def grid(self) -> tuple[int, int, int]:
        """The DiT's token grid of one clip (latent frames, rows, columns)."""
        h, w = self.latent_hw
        return self.latent_frames, h // self.patch[1], w // self.patch[2]

    @property
    def tokens_per_frame(self) -> int:
        """DiT tokens per latent frame (220 at 5b, 880 at 14b)."""
        return self.grid[1] * self.grid[2]

    @property
    def in_dim(self) -> int:
        """The patch embedding's input channels: the latent, plus 4 mask + latent channels (14b: 36)."""
        return self.latent_channels * 2 + 4 if self.first_frame_concat else self.latent_channels

    @property
    def patch_channels(self) -> int:
        """Output values per DiT token (latent channels x patch area)."""
        return self.latent_channels * self.patch[1] * self.patch[2]

    @property
    def vae_patch(self) -> int:
        """Pixel values the frame path's VAE stand-in maps to one latent vector (frames x 3 x stride area)."""
        st, sh, sw = self.vae_stride
        return st * 3 * sh * sw

    @property
    def blocks(self) -> int:
        """Action blocks (4 at 5b): latent frames after the first / frames_per_block."""
        return (self.latent_frames - 1) // self.frames_per_block

    @property
    def horizon(self) -> int:
        """Actions per sample (96 at 5b)."""
        return self.blocks * self.actions_per_block

    @property
    def state_tokens(self) -> int:
        """State tokens per sample (one per block)."""
        return self.blocks * self.states_per_block

    @property
    def image_tokens(self) -> int:
        """CLIP tokens (257 = 16^2 + 1)."""
        return self.image_grid ** 2 + 1

    @property
    def context_tokens(self) -> int:
        """Cross-attention context: image tokens + text tokens (257 + 512)."""
        return self.image_tokens + self.text_len

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def preset_5b() -> DreamZeroConfig:
    """Wan2.2-TI2V-5B's DiT with DreamZero's action and state tokens (about 5.1B parameters)."""
    return DreamZeroConfig(dim=3072, depth=30, heads=24, ffn=14336, latent_channels=48, vae_stride=(4, 16, 16))


def preset_14b() -> DreamZeroConfig:
    """Wan2.1-I2V-14B's DiT (DreamZero's released checkpoints): input 36 channels, output 16."""
    return DreamZeroConfig(dim=5120, depth=40, heads=40, ffn=13824, latent_channels=16, first_frame_concat=True,
                           vae_stride=(4, 8, 8))


def tiny() -> DreamZeroConfig:
    """The structure at small widths: 17 frames of a 64x128 canvas -> 5 latent frames of 8 tokens
    (one conditioning frame + 2 blocks of 2), 4 actions and 1 state per block; CPU tests in seconds."""
    return DreamZeroConfig(dim=32, depth=2, heads=2, ffn=64, latent_channels=8, vae_stride=(4, 16, 16), frames=17,
                           view=(32, 64), actions_per_block=4, action_dim=8, state_dim=8, mlp_hidden=16, text_len=16,
                           text_width=24, image_grid=4, image_width=16, freq_dim=16)


PRESETS: dict[str, Callable[[], DreamZeroConfig]] = {"tiny": tiny, "5b": preset_5b, "14b": preset_14b}

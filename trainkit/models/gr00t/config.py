"""Shapes of the `gr00t` family: `Gr00tConfig`, its presets, and N1.6's image-size rule.

`n16` follows the public Isaac-GR00T N1.6 config: a SigLIP2-style tower (27 x 1152, MLP 4304,
16 heads, patch 14), a 2x2 pixel-unshuffle and the MLP connector LayerNorm(4608) -> 2048 -> GELU
-> 2048 (81 tokens per 252x252 image), a Qwen3-1.7B-style LLM truncated to its first 16 layers
(2048, SwiGLU 6144, 16 query / 8 KV heads x 128, qk-norm, causal) of which the top 4 train, and
a 32-layer DiT action head (1536 = 32 heads x 48, FF 6144, AdaLayerNorm on the flow time) whose
even blocks cross-attend to the VL tokens. `n16-h50` is the same with a 50-action horizon. `tiny`
keeps every structural feature (frozen and trained LLM layers, text/image/self DiT blocks,
padded action and state dims) at widths a CPU trains in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainkit.errors import ModelConfigError

UNSHUFFLE = 2  # pixel-unshuffle factor: 2x2 patches -> one token of 4 x vision_width channels


def n16_resolution(height: int, width: int, *, short_edge: int = 256, multiple: int = 28) -> tuple[int, int]:
    """N1.6's training size of a (height, width) frame: scaled so its shorter edge is 256, then each
    side rounded to the nearest multiple of 28 (patch 14 x unshuffle 2): 252x252 for a square
    frame, 252x336 for 4:3 (480x640)."""
    scale = short_edge / min(height, width)
    return tuple(max(multiple, round(side * scale / multiple) * multiple) for side in (height, width))  # type: ignore[return-value]


@dataclass(kw_only=True)
class Gr00tConfig:
    """Every shape of the model. Widths are channels, depths are block counts."""
    vision_width: int           # SigLIP2 channels (1152)
    vision_depth: int           # SigLIP2 blocks = len(vision_blocks) (27), all frozen
    vision_mlp: int             # SigLIP2 MLP hidden size (4304)
    vision_heads: int           # SigLIP2 attention heads (16)
    patch: int = 14             # patch side in pixels
    image_height: int = 252     # input frame size (n16_resolution of the dataset's frames)
    image_width: int = 252
    lm_width: int               # Qwen3 channels (2048); the connector's output width too
    lm_depth: int               # LLM layers kept (16 of Qwen3-1.7B's 28)
    lm_trained: int = 4         # the top lm_trained layers train (lm_trained list); the rest are frozen
    lm_mlp: int                 # SwiGLU hidden size (6144)
    heads_q: int = 16           # LLM query heads
    heads_kv: int = 8           # LLM key/value heads (grouped-query attention)
    head_dim: int = 128         # LLM channels per head (even: RoPE rotates halves)
    vocab: int = 151_936        # embedding rows (Qwen3's; Gr00tTokenizer uses the first ids)
    text_len: int = 58          # text tokens per sample (prompt + padding)
    rope_theta: float = 1_000_000.0  # Qwen3's RoPE base period
    dit_width: int              # DiT channels (1536 = dit_heads x dit_head_dim)
    dit_depth: int              # DiT blocks (32): even cross-attend (text if idx % 4 == 0, image if 2), odd self-attend
    dit_heads: int = 32
    dit_ff: int                 # DiT feed-forward hidden size (6144)
    head_hidden: int = 1024     # state encoder / DiT output / action decoder hidden size
    action_dim: int = 128       # action channels (robot actions zero-padded, loss masked to the real ones)
    state_dim: int = 128        # state channels (zero-padded likewise)
    horizon: int = 16           # action chunk length
    max_positions: int = 1024   # rows of the learned action position embedding
    time_buckets: int = 1000    # the flow time is discretised to this many buckets for the embeddings
    max_slots: int = 3          # image slots at most (cameras); a batch may carry fewer after pruning

    def __post_init__(self) -> None:
        positive = ("vision_width", "vision_depth", "vision_mlp", "vision_heads", "patch", "image_height",
                    "image_width", "lm_width", "lm_depth", "lm_trained", "lm_mlp", "heads_q", "heads_kv", "head_dim",
                    "vocab", "text_len", "dit_width", "dit_depth", "dit_heads", "dit_ff", "head_hidden",
                    "action_dim", "state_dim", "horizon", "max_positions", "time_buckets", "max_slots")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"Gr00tConfig.{name} must be a positive int, got {value!r}")
        checks = (
            (self.vision_width % self.vision_heads == 0, f"vision_width {self.vision_width} is not divisible by vision_heads {self.vision_heads}"),
            (self.image_height % (self.patch * UNSHUFFLE) == 0 and self.image_width % (self.patch * UNSHUFFLE) == 0,
             f"image {self.image_height}x{self.image_width} is not a multiple of patch x {UNSHUFFLE} = {self.patch * UNSHUFFLE}"),
            (self.lm_trained <= self.lm_depth, f"lm_trained {self.lm_trained} exceeds lm_depth {self.lm_depth}"),
            (self.heads_q % self.heads_kv == 0, f"heads_q {self.heads_q} is not a multiple of heads_kv {self.heads_kv}"),
            (self.head_dim % 2 == 0, f"head_dim {self.head_dim} must be even (RoPE rotates halves)"),
            (self.dit_width % self.dit_heads == 0, f"dit_width {self.dit_width} is not divisible by dit_heads {self.dit_heads}"),
            (self.horizon <= self.max_positions, f"horizon {self.horizon} exceeds max_positions {self.max_positions}"),
            (self.dit_width % 2 == 0, f"dit_width {self.dit_width} must be even (sin/cos time features)"),
        )
        for ok, why in checks:
            if not ok:
                raise ModelConfigError(f"Gr00tConfig: {why}")

    @property
    def patches_per_image(self) -> int:
        """SigLIP2 tokens per image (18 x 18 = 324 at 252x252)."""
        return (self.image_height // self.patch) * (self.image_width // self.patch)

    @property
    def tokens_per_image(self) -> int:
        """VL tokens per image after the 2x2 unshuffle (81 at 252x252, 108 at 252x336)."""
        return self.patches_per_image // UNSHUFFLE ** 2

    @property
    def lm_frozen(self) -> int:
        """LLM layers that do not train (the lower ones)."""
        return self.lm_depth - self.lm_trained


def n16() -> Gr00tConfig:
    """Isaac-GR00T N1.6 shapes, horizon 16 (about 2.6B parameters, 1.3B of them trained)."""
    return Gr00tConfig(vision_width=1152, vision_depth=27, vision_mlp=4304, vision_heads=16, lm_width=2048,
                       lm_depth=16, lm_mlp=6144, dit_width=1536, dit_depth=32, dit_ff=6144)


def n16_h50() -> Gr00tConfig:
    """N1.6 with a 50-action horizon (the probe's shapes)."""
    cfg = n16()
    cfg.horizon = 50
    return cfg


def tiny() -> Gr00tConfig:
    """Same structure at small widths: 2 frozen + 2 trained LLM layers, 4 DiT blocks (text, self,
    image, self) with N1.6's 4 x width feed-forward, 16 padded action/state channels; 4 VL tokens
    per 16x16 image."""
    return Gr00tConfig(vision_width=32, vision_depth=2, vision_mlp=64, vision_heads=2, patch=4, image_height=16,
                       image_width=16, lm_width=64, lm_depth=4, lm_trained=2, lm_mlp=96, heads_q=4, heads_kv=2,
                       head_dim=16, vocab=512, text_len=24, dit_width=32, dit_depth=4, dit_heads=4, dit_ff=128,
                       head_hidden=24, action_dim=16, state_dim=16, horizon=4, max_positions=32)


PRESETS: dict[str, Callable[[], Gr00tConfig]] = {"tiny": tiny, "n16": n16, "n16-h50": n16_h50}

"""Shapes of the `gr00t` family: `Gr00tConfig`, its presets, and N1.6's image-size rule.

`n17` follows GR00T N1.7 as LeRobot 0.6.1 builds it (`GR00T_N1_7_DEFAULTS` in
lerobot/policies/groot/groot_n1_7.py, which mirrors the public checkpoint's config.json; a
checkpoint given to `model.init_from` decides every value it states: weights.py). Backbone: the
LLM of Qwen3-VL-2B (2048, SwiGLU 6144, 16 q / 8 kv heads x 128) cut at `select_layer` 16, all
frozen (`lm_trained` 0; set it to train the top layers), and a 24 x 1024 vision tower with patch
16 and the 2x2 merger (64 tokens per 256x256 view). Head: LayerNorm, 4 self-attention blocks over
the VL tokens (2048 = 32 heads x 64), the 32-block DiT (1536 = 32 x 48) alternating text / image
cross-attention, state and action channels 132, horizon 40, per-embodiment encoders and decoder
(one embodiment's slice trains: `embodiment`, of `embodiments` slots), dropout 0.2 and state
dropout 0.2 in training. `tiny` keeps that structure at CPU widths.

`n16` follows the public Isaac-GR00T N1.6 config: a SigLIP2-style tower (27 x 1152, MLP 4304,
16 heads, patch 14), a 2x2 pixel-unshuffle and the MLP connector LayerNorm(4608) -> 2048 -> GELU
-> 2048 (81 tokens per 252x252 image), a Qwen3-1.7B-style LLM truncated to its first 16 layers
(2048, SwiGLU 6144, 16 query / 8 KV heads x 128, qk-norm, causal) of which the top 4 train, and
a 32-layer DiT action head (1536 = 32 heads x 48, FF 6144, AdaLayerNorm on the flow time) whose
even blocks cross-attend to the VL tokens; no VL self-attention, no dropout. `n16-h50` is the same
with a 50-action horizon. They stay for comparison with the published N1.6 figures and the GPU
runs the memory constants were fitted to (memory.py).
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
    patch: int = 16             # patch side in pixels
    image_height: int = 256     # input frame size (N1.7: 256x256; n16: n16_resolution of the dataset's frames)
    image_width: int = 256
    lm_width: int               # Qwen3 channels (2048); the connector's output width too
    lm_depth: int               # LLM layers kept: the checkpoint's select_layer (16 of 28); features = the last one's output
    lm_trained: int = 0         # the top lm_trained LLM layers train (lm_layers list); the rest are frozen
    lm_mlp: int                 # SwiGLU hidden size (6144)
    heads_q: int = 16           # LLM query heads
    heads_kv: int = 8           # LLM key/value heads (grouped-query attention)
    head_dim: int = 128         # LLM channels per head (even: RoPE rotates halves)
    vocab: int = 151_936        # embedding rows (Qwen3's; Gr00tTokenizer uses the first ids)
    text_len: int = 58          # text tokens per sample (prompt + padding)
    rope_theta: float = 5_000_000.0  # the LLM's RoPE base period (Qwen3-VL's; Qwen3's 1e6 in n16)
    dit_width: int              # DiT channels (1536 = dit_heads x dit_head_dim)
    dit_depth: int              # DiT blocks (32): even cross-attend (text if idx % 4 == 0, image if 2), odd self-attend
    dit_heads: int = 32
    dit_ff: int                 # DiT feed-forward hidden size (6144 = 4 x dit_width, diffusers' FeedForward)
    vl_layers: int = 4          # self-attention blocks over the VL tokens before the DiT (N1.7's vl_self_attention; 0: none)
    vl_heads: int = 32          # their heads; vl_heads x vl_head_dim = lm_width (feed-forward 4 x lm_width)
    vl_head_dim: int = 64
    head_hidden: int = 1024     # state encoder / DiT output / action decoder hidden size
    action_dim: int = 132       # action channels (robot actions zero-padded, loss masked to the real ones)
    state_dim: int = 132        # state channels (zero-padded likewise)
    horizon: int = 40           # action chunk length
    max_positions: int = 1024   # rows of the learned action position embedding
    time_buckets: int = 1000    # the flow time is discretised to this many buckets for the embeddings
    max_slots: int = 3          # image slots at most (cameras); a batch may carry fewer after pruning
    embodiments: int = 32       # per-embodiment slots of the checkpoint's encoder / decoder tensors (export writes all)
    embodiment: int = 10        # the slot this model trains ("new_embodiment" is 10 in LeRobot's N1.7 mapping)
    dropout: float = 0.2        # dropout of the VL self-attention and DiT blocks in training (diffusers' places)
    state_dropout: float = 0.2  # probability that a sample's state features are zeroed in training

    def __post_init__(self) -> None:
        positive = ("vision_width", "vision_depth", "vision_mlp", "vision_heads", "patch", "image_height",
                    "image_width", "lm_width", "lm_depth", "lm_mlp", "heads_q", "heads_kv", "head_dim",
                    "vocab", "text_len", "dit_width", "dit_depth", "dit_heads", "dit_ff", "head_hidden",
                    "action_dim", "state_dim", "horizon", "max_positions", "time_buckets", "max_slots", "embodiments",
                    "vl_heads", "vl_head_dim")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"Gr00tConfig.{name} must be a positive int, got {value!r}")
        for name in ("lm_trained", "vl_layers", "embodiment"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ModelConfigError(f"Gr00tConfig.{name} must be an int >= 0, got {value!r}")
        for name in ("dropout", "state_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise ModelConfigError(f"Gr00tConfig.{name} must be a probability in [0, 1), got {value!r}")
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
            (self.vl_heads * self.vl_head_dim == self.lm_width,
             f"vl_heads x vl_head_dim {self.vl_heads} x {self.vl_head_dim} is not lm_width {self.lm_width}"),
            (self.embodiment < self.embodiments, f"embodiment {self.embodiment} is not a slot of 0..{self.embodiments - 1}"),
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


def n17() -> Gr00tConfig:
    """GR00T N1.7 (LeRobot 0.6.1's defaults, the public checkpoint's config): the backbone's LLM cut at
    select_layer 16 and frozen, the ~1.1B head trained (one embodiment's slice)."""
    return Gr00tConfig(vision_width=1024, vision_depth=24, vision_mlp=4096, vision_heads=16, lm_width=2048,
                       lm_depth=16, lm_mlp=6144, dit_width=1536, dit_depth=32, dit_ff=6144)


def n16() -> Gr00tConfig:
    """Isaac-GR00T N1.6 shapes, horizon 16 (about 2.6B parameters, 1.3B of them trained)."""
    return Gr00tConfig(vision_width=1152, vision_depth=27, vision_mlp=4304, vision_heads=16, patch=14,
                       image_height=252, image_width=252, lm_width=2048, lm_depth=16, lm_trained=4, lm_mlp=6144,
                       rope_theta=1_000_000.0, dit_width=1536, dit_depth=32, dit_ff=6144, vl_layers=0,
                       action_dim=128, state_dim=128, horizon=16, embodiments=1, embodiment=0, dropout=0.0,
                       state_dropout=0.0)


def n16_h50() -> Gr00tConfig:
    """N1.6 with a 50-action horizon (the probe's shapes)."""
    cfg = n16()
    cfg.horizon = 50
    return cfg


def tiny() -> Gr00tConfig:
    """N1.7's structure at small widths: 2 frozen + 2 trained LLM layers (n17 trains none: the option
    is exercised here), 2 VL self-attention blocks, 4 DiT blocks (text, self, image, self) with the
    4 x width feed-forward, 16 padded action/state channels, 4 embodiment slots (slot 1 trains),
    state dropout 0.2; 4 VL tokens per 16x16 image. Dropout 0: the equality tests (world sizes,
    resume) compare runs whose dropout masks come from each rank's own generator."""
    return Gr00tConfig(vision_width=32, vision_depth=2, vision_mlp=64, vision_heads=2, patch=4, image_height=16,
                       image_width=16, lm_width=64, lm_depth=4, lm_trained=2, lm_mlp=96, heads_q=4, heads_kv=2,
                       head_dim=16, vocab=512, text_len=24, dit_width=32, dit_depth=4, dit_heads=4, dit_ff=128,
                       vl_layers=2, vl_heads=4, vl_head_dim=16, head_hidden=24, action_dim=16, state_dim=16, horizon=4,
                       max_positions=32, embodiments=4, embodiment=1, dropout=0.0)


PRESETS: dict[str, Callable[[], Gr00tConfig]] = {"tiny": tiny, "n17": n17, "n16": n16, "n16-h50": n16_h50}

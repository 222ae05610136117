"""Shapes of the `pi05` family: `Pi05Config` and its presets.

`full` is OpenPI's Pi0.5: SigLIP So400m/14 (27 x 1152, MLP 4304, 16 heads, 224 px -> 256 tokens per
image), projector 1152 -> 2048, Gemma-2B backbone (18 x 2048, GeGLU 16384, 8 query / 1 KV head x 256,
vocab 257,152) and the Gemma-300M action expert (18 x 1024, GeGLU 4096, same heads) with adaRMSNorm
on the flow time. `tiny` keeps the structure at small widths for CPU tests; `tiny_deep` has the full
block counts (27 / 18) at tiny widths, for counting FSDP units and all-gathers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from trainkit.errors import ModelConfigError
from trainkit.models.lora import check_lora_fields
from trainkit.models.pi05.lora import LEROBOT_DEFAULT, LORA_TARGETS
from trainkit.models.pi05.tokenizer import sentencepiece_file


@dataclass(kw_only=True)
class Pi05Config:
    """Every shape of the model. Widths are channels, depths are block counts."""
    vision_width: int        # SigLIP channels (So400m: 1152)
    vision_depth: int        # SigLIP blocks = len(vision_blocks) (27)
    vision_mlp: int          # SigLIP MLP hidden size (4304)
    vision_heads: int        # SigLIP attention heads (16; head size = width / heads)
    patch: int = 14          # patch side in pixels (patchify conv kernel = stride)
    image_size: int = 224    # square input side in pixels; (image_size / patch)^2 tokens per image
    # How a camera view of another size becomes image_size square, on the device: "pad" (LeRobot's and
    # openpi's resize-with-pad: aspect kept, scaled to fit, centred on black, as the real checkpoints
    # were trained and are served) or "stretch" (bilinear, antialiased, aspect not kept).
    image_resize: Literal["pad", "stretch"] = "pad"
    # the projector is one Linear vision_width -> lm_width
    lm_width: int            # Gemma backbone channels (2048)
    lm_depth: int            # MoT layers = len(lm_layers) (18); the action expert has the same depth
    lm_mlp: int              # backbone GeGLU hidden size (16384)
    heads_q: int = 8         # query heads, both experts
    heads_kv: int = 1        # key/value heads, both experts (1 = multi-query)
    head_dim: int = 256      # channels per head, both experts (even: RoPE rotates halves)
    vocab: int = 257_152     # text embedding rows (Gemma's vocab size; PromptTokenizer uses a part)
    expert_width: int        # action expert channels (1024)
    expert_mlp: int          # action expert GeGLU hidden size (4096)
    action_dim: int = 32     # action channels (robot actions zero-padded to this)
    # the robot's state channels at most (LeRobot's and openpi's max_state_dim); the state enters the
    # prompt as bins, so nothing pads it, but a dataset with more is refused at launch as LeRobot would
    max_state_dim: int = 32
    horizon: int = 50        # action chunk length = suffix tokens
    text_len: int = 200      # prompt tokens per sample (task bytes + discretised state + padding)
    max_slots: int = 3       # image slots at most (cameras); a batch may carry fewer after pruning
    state_bins: int = 256    # bins of the discretised state in the prompt
    rope_theta: float = 10_000.0  # RoPE base period
    # The flow loss's mean: over all `action_dim` channels ("all": openpi's and trainkit's default), or
    # over the robot's real ones only, the zero padding left out ("real": LeRobot's PI05Policy.forward).
    loss_over: Literal["all", "real"] = "all"
    # The prompt's tokenizer (pi05/tokenizer.py): a SentencePiece `tokenizer.model` (or a folder with
    # one; PaliGemma's is what the real checkpoints were trained with) with openpi's Pi0.5 prompt;
    # "tiny": trainkit's shipped tiny SentencePiece model (the tiny presets'); "builtin": trainkit's
    # byte + state-bin tokenizer, which LeRobot cannot serve; "": none named (model.init_from's own
    # tokenizer when its folder carries one, else the built-in; a real-width checkpoint without one is refused)
    tokenizer: str = ""
    # LoRA (trainkit/models/lora.py, pi05/lora.py): 0 trains the model in full; r > 0 freezes it and trains
    # rank-r adapters on lora_targets (LeRobot's module names), LeRobot's peft defaults below
    lora_rank: int = 0
    lora_alpha: float = 8.0  # scale = alpha / rank (LeRobot: peft's default alpha 8 at r = 16)
    lora_targets: tuple[str, ...] = LEROBOT_DEFAULT

    def __post_init__(self) -> None:
        self.lora_targets = tuple(self.lora_targets)
        problem = check_lora_fields("Pi05Config", self.lora_rank, self.lora_alpha, self.lora_targets, LORA_TARGETS)
        if problem:
            raise ModelConfigError(problem)
        positive = ("vision_width", "vision_depth", "vision_mlp", "vision_heads", "patch", "image_size",
                    "lm_width", "lm_depth", "lm_mlp", "heads_q", "heads_kv", "head_dim", "vocab",
                    "expert_width", "expert_mlp", "action_dim", "max_state_dim", "horizon", "text_len", "max_slots",
                    "state_bins")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"Pi05Config.{name} must be a positive int, got {value!r}")
        if self.vision_width % self.vision_heads:
            raise ModelConfigError(f"Pi05Config.vision_width {self.vision_width} is not divisible by vision_heads {self.vision_heads}")
        if self.image_size % self.patch:
            raise ModelConfigError(f"Pi05Config.image_size {self.image_size} is not a multiple of patch {self.patch}")
        if self.heads_q % self.heads_kv:
            raise ModelConfigError(f"Pi05Config.heads_q {self.heads_q} is not a multiple of heads_kv {self.heads_kv}")
        if self.head_dim % 2:
            raise ModelConfigError(f"Pi05Config.head_dim {self.head_dim} must be even (RoPE rotates halves)")
        if self.image_resize not in ("pad", "stretch"):
            raise ModelConfigError(f"Pi05Config.image_resize must be 'pad' or 'stretch', got {self.image_resize!r}")
        if self.loss_over not in ("all", "real"):
            raise ModelConfigError(f"Pi05Config.loss_over must be 'all' or 'real', got {self.loss_over!r}")
        if self.expert_width % 2:
            raise ModelConfigError(f"Pi05Config.expert_width {self.expert_width} must be even (sin/cos time features)")

    def tokenizer_file(self) -> Path | None:
        """The SentencePiece file of `tokenizer` (None: the built-in tokenizer)."""
        return sentencepiece_file(self.tokenizer)

    @property
    def tokens_per_image(self) -> int:
        """Vision tokens per image slot ((224 / 14)^2 = 256 at full size)."""
        return (self.image_size // self.patch) ** 2


def full() -> Pi05Config:
    """OpenPI Pi0.5 shapes (about 3.25B parameters with the 527M embedding; see pi05.MoTLayer on the last layer)."""
    return Pi05Config(vision_width=1152, vision_depth=27, vision_mlp=4304, vision_heads=16,
                      lm_width=2048, lm_depth=18, lm_mlp=16384, expert_width=1024, expert_mlp=4096)


def tiny() -> Pi05Config:
    """Same structure at small widths (two blocks each, 16 tokens per image): CPU tests in seconds.
    LeRobot-shaped where it costs nothing: 8 query heads (LeRobot's attention takes 8 whatever its
    config says) and 1 KV head as Gemma's, and the shipped tiny SentencePiece tokenizer, so that its
    export is served offline (trainkit/weights/servable.py checks the shapes)."""
    return Pi05Config(vision_width=32, vision_depth=2, vision_mlp=64, vision_heads=2, patch=4, image_size=16,
                      lm_width=64, lm_depth=2, lm_mlp=128, heads_q=8, heads_kv=1, head_dim=16, vocab=1024,
                      expert_width=32, expert_mlp=64, text_len=48, tokenizer="tiny")


def tiny_deep() -> Pi05Config:
    """The full preset's block counts (27 vision, 18 MoT) at tiny widths: counts FSDP units/all-gathers."""
    cfg = tiny()
    cfg.vision_depth, cfg.lm_depth = 27, 18
    return cfg


PRESETS: dict[str, Callable[[], Pi05Config]] = {"tiny": tiny, "tiny_deep": tiny_deep, "full": full}

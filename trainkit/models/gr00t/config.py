"""Shapes of the `gr00t` family: `Gr00tConfig` and its presets.

`n17` is GR00T N1.7 as LeRobot 0.6.1 builds it (`GR00T_N1_7_DEFAULTS` and
`_cosmos_reason2_qwen3_vl_config()` in lerobot/policies/groot/groot_n1_7.py, which mirror the public
checkpoint's config.json; a checkpoint given to `model.init_from` decides every value it states:
weights.py). Backbone: Qwen3-VL-2B (Cosmos-Reason2-2B): its ViT (24 x 1024, patch 16, temporal
patch 2, the 2x2 merger, deepstack after blocks 5/11/17) and its LLM (2048, SwiGLU 6144, 16 q / 8
kv heads x 128, qk RMSNorm, interleaved mRoPE 24/20/20, theta 5e6) cut at `select_layer` 16 and
frozen (`lm_trained` 0; set it to train the top LLM layers); 64 tokens per 256x256 view. Head:
LayerNorm, 4 self-attention blocks over the VL tokens (2048 = 32 heads x 64), the 32-block DiT
(1536 = 32 x 48, feed-forward 4 x width) alternating text / image cross-attention, state and
action channels 132, horizon 40, per-embodiment encoders and decoder (one embodiment's slice
trains: `embodiment`, of `embodiments` slots), dropout 0.2 and state dropout 0.2 in training.
Views: N1.7's transform (`view_transform` "n17": bicubic to 256, centre crop 230, bicubic back), as
LeRobot's N1.7 processor runs it by default, training included (its torch path has no random crop;
`random_crop` turns on Isaac-GR00T's). `tiny` keeps that structure at CPU widths. (The N1.6-shaped
presets of earlier versions are gone: N1.6 has no reference implementation to hold a model to, and
their GPU runs measured a model that no longer exists.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from trainkit.errors import ModelConfigError
from trainkit.models.gr00t.lora import ISAAC_DEFAULT, LORA_TARGETS
from trainkit.models.gr00t.qwen3_vl.config import Qwen3VLConfig
from trainkit.models.lora import check_lora_fields

VIEW_TRANSFORMS = ("n17", "resize")  # Gr00tConfig.view_transform's values


@dataclass(kw_only=True)
class Gr00tConfig:
    """Every shape of the model. Widths are channels, depths are block counts."""
    vision_width: int           # ViT channels (1024)
    vision_depth: int           # ViT blocks = len(vision_blocks) (24), all frozen
    vision_mlp: int             # ViT MLP hidden size (4096)
    vision_heads: int = 16      # ViT attention heads
    patch: int = 16             # ViT patch side in pixels
    temporal_patch: int = 2     # frames per ViT patch (a view is its frame repeated)
    merge: int = 2              # merge x merge patches -> one LLM token
    position_table: int = 2304  # rows of the ViT's learned position table (a square grid)
    deepstack: tuple[int, ...] = (5, 11, 17)  # ViT blocks whose merged output is added into LLM layers 0, 1, ...
    image_height: int = 256     # every view's size at the ViT (N1.7: 256x256)
    image_width: int = 256
    # each view's transform on the device (batches.py `view_settings`): "n17": N1.7's (bicubic to the view
    # size, centre crop of 230/256 of each side, bicubic back: LeRobot 0.6.1's default); "resize": bilinear
    # (antialiased) to the view size, no crop
    view_transform: Literal["n17", "resize"] = "n17"
    # "n17" in training: the crop window at a random place per sample (Isaac-GR00T's augmentation; LeRobot's
    # default transform has none); predictions and exports crop the centre
    random_crop: bool = False
    lm_width: int               # LLM channels (2048); the mergers' output width too
    lm_depth: int               # LLM layers built: the checkpoint's select_layer (16 of 28); features = the last one's output
    lm_trained: int = 0         # the top lm_trained LLM layers train (lm_layers list); the rest are frozen
    lm_mlp: int                 # SwiGLU hidden size (6144)
    heads_q: int = 16           # LLM query heads
    heads_kv: int = 8           # LLM key/value heads (grouped-query attention)
    head_dim: int = 128         # LLM channels per head
    rms_eps: float = 1e-6       # the LLM's RMSNorm epsilon
    rope_theta: float = 5_000_000.0  # the LLM's RoPE base period
    mrope_section: tuple[int, int, int] = (24, 20, 20)  # rotary frequencies per axis (t, h, w), interleaved
    vocab: int = 151_936        # embedding rows
    image_token_id: int = 151_655  # <|image_pad|>: one per image token in the LLM's input
    vision_start_id: int = 151_652  # <|vision_start|>: before each view's run of image tokens
    vision_end_id: int = 151_653    # <|vision_end|>: after it
    text_len: int = 58          # a prompt's tokens besides its views' runs (chat turn + task): the FLOP estimate's, and fixed_len's
    fixed_len: bool = False     # pad every prompt to views x (tokens_per_image + 2) + text_len tokens (fixed shapes for
                                # compile / CUDA graphs; a longer prompt is an error); off: to the batch's longest
                                # (LeRobot's: its VL self-attention sees the padding, so the padded length moves the output)
    tokenizer: str = ""         # folder of the backbone's tokenizer files (tokenizer.json + chat template, chat_tokenizer.py);
                                # "": the builtin byte-level stand-in; model.init_from's folder when it holds them
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
    # LoRA (trainkit/models/lora.py, gr00t/lora.py): 0 trains the head in full; r > 0 freezes the model and
    # trains rank-r adapters on lora_targets of the VL self-attention and the DiT (Isaac-GR00T's names)
    lora_rank: int = 0
    lora_alpha: float = 16.0  # scale = alpha / rank (Isaac-GR00T get_lora_model: lora_alpha 16 at r = 32)
    lora_targets: tuple[str, ...] = ISAAC_DEFAULT

    def __post_init__(self) -> None:
        self.lora_targets = tuple(self.lora_targets)
        problem = check_lora_fields("Gr00tConfig", self.lora_rank, self.lora_alpha, self.lora_targets, LORA_TARGETS)
        if problem:
            raise ModelConfigError(problem)
        self.deepstack = tuple(self.deepstack)
        self.mrope_section = tuple(self.mrope_section)  # type: ignore[assignment]
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
        if not isinstance(self.fixed_len, bool):
            raise ModelConfigError(f"Gr00tConfig.fixed_len must be true or false, got {self.fixed_len!r}")
        if self.view_transform not in VIEW_TRANSFORMS:
            raise ModelConfigError(f"Gr00tConfig.view_transform must be one of "
                                   f"{', '.join(map(repr, VIEW_TRANSFORMS))}, got {self.view_transform!r}")
        if not isinstance(self.random_crop, bool):
            raise ModelConfigError(f"Gr00tConfig.random_crop must be true or false, got {self.random_crop!r}")
        if not isinstance(self.tokenizer, str):
            raise ModelConfigError(f"Gr00tConfig.tokenizer must be a folder path (a string), got {self.tokenizer!r}")
        checks = (
            (self.lm_trained <= self.lm_depth, f"lm_trained {self.lm_trained} exceeds lm_depth {self.lm_depth}"),
            (self.dit_width % self.dit_heads == 0, f"dit_width {self.dit_width} is not divisible by dit_heads {self.dit_heads}"),
            (self.horizon <= self.max_positions, f"horizon {self.horizon} exceeds max_positions {self.max_positions}"),
            (self.dit_width % 2 == 0, f"dit_width {self.dit_width} must be even (sin/cos time features)"),
            (self.vl_heads * self.vl_head_dim == self.lm_width,
             f"vl_heads x vl_head_dim {self.vl_heads} x {self.vl_head_dim} is not lm_width {self.lm_width}"),
            (self.embodiment < self.embodiments, f"embodiment {self.embodiment} is not a slot of 0..{self.embodiments - 1}"),
            (len(self.deepstack) <= self.lm_depth, f"deepstack {self.deepstack} adds into more LLM layers than lm_depth {self.lm_depth}"),
            (all(0 <= i < self.vocab for i in (self.image_token_id, self.vision_start_id, self.vision_end_id))
             and len({self.image_token_id, self.vision_start_id, self.vision_end_id}) == 3,
             f"image_token_id, vision_start_id, vision_end_id ({self.image_token_id}, {self.vision_start_id}, "
             f"{self.vision_end_id}) must be distinct embedding rows (0..{self.vocab - 1})"),
            (not self.random_crop or self.view_transform == "n17",
             f"random_crop moves N1.7's crop window; view_transform {self.view_transform!r} crops nothing"),
            # LeRobot's N1.7 transform resizes to (image_height, image_height) before it crops: ours only if square
            (self.view_transform != "n17" or self.image_height == self.image_width,
             f"view_transform 'n17' is LeRobot's for square views, got {self.image_height}x{self.image_width}: "
             "set view_transform = 'resize'"),
        )
        for ok, why in checks:
            if not ok:
                raise ModelConfigError(f"Gr00tConfig: {why}")
        self.backbone  # Qwen3VLConfig's own checks (mRoPE sections, head sizes, the image grid)

    @property
    def backbone(self) -> Qwen3VLConfig:
        """The Qwen3-VL backbone's shapes (trainkit/models/gr00t/qwen3_vl/config.py)."""
        return Qwen3VLConfig(hidden=self.lm_width, select_layer=self.lm_depth, mlp=self.lm_mlp, heads_q=self.heads_q,
                             heads_kv=self.heads_kv, head_dim=self.head_dim, rms_eps=self.rms_eps,
                             rope_theta=self.rope_theta, mrope_section=self.mrope_section, vocab=self.vocab,
                             image_token_id=self.image_token_id, vision_width=self.vision_width,
                             vision_depth=self.vision_depth, vision_mlp=self.vision_mlp, vision_heads=self.vision_heads,
                             patch=self.patch, temporal_patch=self.temporal_patch, merge=self.merge,
                             position_table=self.position_table, deepstack=self.deepstack,
                             image_size=(self.image_height, self.image_width))

    @property
    def patches_per_image(self) -> int:
        """ViT patches per view (16 x 16 = 256 at 256x256)."""
        return (self.image_height // self.patch) * (self.image_width // self.patch)

    @property
    def tokens_per_image(self) -> int:
        """LLM tokens per view after the merge (64 at 256x256)."""
        return self.patches_per_image // self.merge ** 2

    @property
    def lm_frozen(self) -> int:
        """LLM layers that do not train (the lower ones)."""
        return self.lm_depth - self.lm_trained


def n17() -> Gr00tConfig:
    """GR00T N1.7 (LeRobot 0.6.1's defaults, the public checkpoint's config): the backbone frozen
    (2.2B), the head's 1.1B trained (one embodiment's slice)."""
    return Gr00tConfig(vision_width=1024, vision_depth=24, vision_mlp=4096, lm_width=2048, lm_depth=16, lm_mlp=6144,
                       dit_width=1536, dit_depth=32, dit_ff=6144, view_transform="n17", random_crop=False)


def tiny() -> Gr00tConfig:
    """N1.7's structure at small widths: a 2-block ViT (both deepstack), 2 frozen + 2 trained LLM
    layers (n17 trains none: the option is exercised here), 2 VL self-attention blocks, 4 DiT blocks
    (text, self, image, self) with the 4 x width feed-forward, 16 padded action/state channels, 4
    embodiment slots (slot 1 trains), state dropout 0.2; 4 VL tokens per 16x16 view; the builtin
    tokenizer's special-token ids (chat_tokenizer.py); N1.7's view transform (16 -> centre 14 -> 16).
    Dropout 0: the equality tests (world sizes, resume) compare runs whose dropout masks come from
    each rank's own generator."""
    return Gr00tConfig(vision_width=32, vision_depth=2, vision_mlp=64, vision_heads=2, patch=4, position_table=36,
                       deepstack=(0, 1), image_height=16, image_width=16, lm_width=64, lm_depth=4, lm_trained=2,
                       lm_mlp=96, heads_q=4, heads_kv=2, head_dim=16, rope_theta=100.0, mrope_section=(3, 3, 2),
                       vocab=300, image_token_id=261, vision_start_id=259,
                       vision_end_id=260, text_len=64, dit_width=32, dit_depth=4, dit_heads=4, dit_ff=128,
                       vl_layers=2, vl_heads=4, vl_head_dim=16, head_hidden=24, action_dim=16, state_dim=16, horizon=4,
                       max_positions=32, embodiments=4, embodiment=1, dropout=0.0, view_transform="n17")


PRESETS: dict[str, Callable[[], Gr00tConfig]] = {"tiny": tiny, "n17": n17}

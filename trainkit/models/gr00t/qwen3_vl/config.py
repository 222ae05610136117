"""Shapes of GR00T N1.7's vision-language backbone, Qwen3-VL-2B (NVIDIA's Cosmos-Reason2-2B):
`Qwen3VLConfig`, the full preset `cosmos_reason2_2b` and `from_hf_config`, which reads a Qwen3-VL
`config.json` (its `text_config` / `vision_config`), so tiny test backbones and other Qwen3-VL
checkpoints build from the file that describes them.

LeRobot 0.6.1 hard-codes Cosmos-Reason2-2B's config (`lerobot/policies/groot/groot_n1_7.py`,
`_cosmos_reason2_qwen3_vl_config`) and GR00T N1.7's `config.json` names only the model (`model_name`) and `select_layer`; the preset
here carries the same numbers. Only the first `select_layer` LLM layers are built (N1.7 deletes
the rest; its features are layer select_layer - 1's output, before the final norm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainkit.errors import ModelConfigError


@dataclass(kw_only=True)
class Qwen3VLConfig:
    """Every shape of the backbone. Widths are channels, depths are block counts."""
    hidden: int = 2048              # LLM channels (= the vision mergers' output width)
    select_layer: int = 16          # LLM layers built (N1.7: 16 of Cosmos-Reason2-2B's 28)
    mlp: int = 6144                 # LLM SwiGLU hidden size
    heads_q: int = 16               # LLM query heads
    heads_kv: int = 8               # LLM key/value heads (grouped-query attention)
    head_dim: int = 128             # LLM channels per head
    rms_eps: float = 1e-6           # RMSNorm epsilon (layer norms and the per-head q/k norms)
    rope_theta: float = 5_000_000.0  # LLM RoPE base period
    mrope_section: tuple[int, int, int] = (24, 20, 20)  # rotary frequencies per axis (t, h, w), interleaved
    vocab: int = 151_936            # token embedding rows
    image_token_id: int = 151_655   # <|image_pad|>: one per merged image token in input_ids
    vision_width: int = 1024        # ViT channels
    vision_depth: int = 24          # ViT blocks
    vision_mlp: int = 4096          # ViT MLP hidden size (GELU, tanh approximation)
    vision_heads: int = 16          # ViT attention heads
    patch: int = 16                 # ViT patch side in pixels
    temporal_patch: int = 2         # frames per patch (an image is its frame repeated)
    merge: int = 2                  # merge x merge patches -> one LLM token (the mergers)
    position_table: int = 2304      # rows of the learned ViT position table (a square grid, 48 x 48)
    deepstack: tuple[int, ...] = (5, 11, 17)  # ViT blocks whose merged output is added into LLM layers 0, 1, 2
    image_size: tuple[int, int] = (256, 256)  # (H, W) of every view given to the ViT (N1.7's target size)

    def __post_init__(self) -> None:
        self.mrope_section = tuple(self.mrope_section)
        self.deepstack = tuple(self.deepstack)
        self.image_size = tuple(self.image_size)
        for name in ("hidden", "select_layer", "mlp", "heads_q", "heads_kv", "head_dim", "vocab", "vision_width",
                     "vision_depth", "vision_mlp", "vision_heads", "patch", "temporal_patch", "merge",
                     "position_table"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"Qwen3VLConfig.{name} must be a positive int, got {value!r}")
        side = round(self.position_table ** 0.5)
        h, w = self.image_size
        checks = (
            (self.heads_q % self.heads_kv == 0, f"heads_q {self.heads_q} is not a multiple of heads_kv {self.heads_kv}"),
            (len(self.mrope_section) == 3 and sum(self.mrope_section) == self.head_dim // 2,
             f"mrope_section {self.mrope_section} must be 3 counts summing to head_dim / 2 = {self.head_dim // 2}"),
            (self.vision_width % self.vision_heads == 0 and (self.vision_width // self.vision_heads) % 4 == 0,
             f"vision_width {self.vision_width} / vision_heads {self.vision_heads} must be a multiple of 4 "
             "(2-D rotary: half the channels per axis, rotated in halves)"),
            (side * side == self.position_table, f"position_table {self.position_table} is not a square number"),
            (all(0 <= i < self.vision_depth for i in self.deepstack) and len(set(self.deepstack)) == len(self.deepstack),
             f"deepstack {self.deepstack} must name distinct ViT blocks in 0..{self.vision_depth - 1}"),
            (h % (self.patch * self.merge) == 0 and w % (self.patch * self.merge) == 0,
             f"image_size {h}x{w} is not a multiple of patch x merge = {self.patch * self.merge}"),
        )
        for ok, why in checks:
            if not ok:
                raise ModelConfigError(f"Qwen3VLConfig: {why}")

    @property
    def grid(self) -> tuple[int, int]:
        """ViT patches per image, (rows, cols) (16 x 16 at 256 x 256)."""
        return self.image_size[0] // self.patch, self.image_size[1] // self.patch

    @property
    def merged_grid(self) -> tuple[int, int]:
        """LLM tokens per image after the merge, (rows, cols) (8 x 8 at 256 x 256)."""
        rows, cols = self.grid
        return rows // self.merge, cols // self.merge

    @property
    def tokens_per_image(self) -> int:
        """<|image_pad|> tokens per view (64 at 256 x 256)."""
        rows, cols = self.merged_grid
        return rows * cols


def cosmos_reason2_2b() -> Qwen3VLConfig:
    """GR00T N1.7's backbone: Cosmos-Reason2-2B's shapes (LeRobot 0.6.1's hard-coded config), 16 layers."""
    return Qwen3VLConfig()


def from_hf_config(doc: dict[str, Any], *, select_layer: int, image_size: tuple[int, int] = (256, 256)) -> Qwen3VLConfig:
    """The backbone of a Qwen3-VL `config.json` (as a dict), its first `select_layer` LLM layers."""
    try:
        text, vision = doc["text_config"], doc["vision_config"]
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        theta = rope.get("rope_theta", text.get("rope_theta"))
        if text["hidden_size"] != vision["out_hidden_size"]:
            raise ModelConfigError(f"vision out_hidden_size {vision['out_hidden_size']} differs from the LLM's "
                                   f"hidden_size {text['hidden_size']}")
        if select_layer > text["num_hidden_layers"]:
            raise ModelConfigError(f"select_layer {select_layer} exceeds the LLM's {text['num_hidden_layers']} layers")
        return Qwen3VLConfig(
            hidden=text["hidden_size"], select_layer=select_layer, mlp=text["intermediate_size"],
            heads_q=text["num_attention_heads"], heads_kv=text["num_key_value_heads"],
            head_dim=text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"],
            rms_eps=text.get("rms_norm_eps", 1e-6), rope_theta=float(theta), mrope_section=tuple(rope["mrope_section"]),
            vocab=text["vocab_size"], image_token_id=doc["image_token_id"], vision_width=vision["hidden_size"],
            vision_depth=vision["depth"], vision_mlp=vision["intermediate_size"], vision_heads=vision["num_heads"],
            patch=vision["patch_size"], temporal_patch=vision["temporal_patch_size"],
            merge=vision["spatial_merge_size"], position_table=vision["num_position_embeddings"],
            deepstack=tuple(vision["deepstack_visual_indexes"]), image_size=image_size)
    except (KeyError, TypeError) as e:
        raise ModelConfigError(f"not a Qwen3-VL config.json: missing or malformed {e}") from None

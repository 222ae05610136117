"""GR00T N1.7's vision-language backbone: Qwen3-VL-2B (Cosmos-Reason2-2B) in plain PyTorch.

forward(input_ids, attention_mask, images):
1. the vision tower (vision.py) over every view of the batch -> image tokens and the
   deepstack tokens;
2. token embeddings, the image tokens written at the <|image_pad|> positions in order (sample by
   sample, view by view: the order the processor lays the views out, chat_tokenizer.py);
3. the first `select_layer` LLM layers (text.py) with interleaved mRoPE positions
   (mrope.py); after layers 0, 1, 2 the deepstack tokens are added at the image positions;
4. features = the last built layer's output, before the final norm and before any deepstack
   addition to it (what LeRobot 0.6.1 captures with a hook on that layer).
No Python loop over samples or images and no data-dependent shape: the image tokens are placed
with `masked_scatter`, so the step captures in a CUDA graph. Every view of a batch has the
config's `image_size`.

Checkpoints: parameter names are transformers' under `visual.` and `language_model.`, the layout
of LeRobot 0.6.1 / Isaac-GR00T N1.7 checkpoints below `BACKBONE_PREFIX` (`backbone.model.model.`);
`backbone_key` maps a checkpoint key to this module's name (None: not built here).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from trainkit.errors import ModelConfigError
from trainkit.models.gr00t.qwen3_vl.mrope import mrope_positions, mrope_tables
from trainkit.models.gr00t.qwen3_vl.config import Qwen3VLConfig
from trainkit.models.gr00t.qwen3_vl.text import TextModel, padded_causal_mask
from trainkit.models.gr00t.qwen3_vl.vision import VisionTower

# LeRobot GR00TN17 / Isaac-GR00T N1.7 checkpoints: backbone.model is Qwen3VLForConditionalGeneration
BACKBONE_PREFIX = "backbone.model.model."


def backbone_key(name: str, cfg: Qwen3VLConfig) -> str | None:
    """This module's parameter name for a checkpoint key, or None when the key is not built here
    (other parts of the checkpoint, the final norm, the LM head, layers >= select_layer)."""
    if not name.startswith(BACKBONE_PREFIX):
        return None
    rest = name[len(BACKBONE_PREFIX):]
    if rest.startswith("visual."):
        return rest
    if rest.startswith("language_model.embed_tokens."):
        return rest
    if rest.startswith("language_model.layers."):
        return rest if int(rest.split(".")[2]) < cfg.select_layer else None
    return None


@dataclass
class BackboneOutput:
    features: torch.Tensor        # (B, T, hidden): layer select_layer - 1's output, before the final norm
    image_mask: torch.Tensor      # (B, T) bool: <|image_pad|> positions
    attention_mask: torch.Tensor  # (B, T) bool: real (not padding) tokens


class Qwen3VLBackbone(nn.Module):
    """Qwen3-VL-2B for GR00T N1.7. Block lists: `visual.blocks`, `language_model.layers`."""

    def __init__(self, cfg: Qwen3VLConfig):
        super().__init__()
        self.cfg = cfg
        self.visual = VisionTower(cfg)
        self.language_model = TextModel(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, images: torch.Tensor) -> BackboneOutput:
        """input_ids (B, T) int64 (chat_tokenizer.py's layout, padded either side), attention_mask (B, T)
        bool, images (N, 3, H, W) normalised views in token order, N = the <|image_pad|> runs of the
        batch (N may be 0: no view in the batch)."""
        cfg = self.cfg
        valid = attention_mask.bool()
        image_mask = (input_ids == cfg.image_token_id) & valid
        embed = self.language_model.embed_tokens
        h = embed(input_ids)
        deep: list[torch.Tensor] = []
        if images.shape[0]:
            if tuple(images.shape[1:]) != (3, *cfg.image_size):
                raise ModelConfigError(f"views of {tuple(images.shape[1:])} given to a backbone built for "
                                       f"(3, {cfg.image_size[0]}, {cfg.image_size[1]}) (Qwen3VLConfig.image_size)")
            tokens, deep = self.visual(images)
            where = image_mask[:, :, None]
            h = h.masked_scatter(where, tokens.to(h.dtype))
            # deepstack added where the images sit and 0 elsewhere: no gather, no data-dependent shape
            deep = [torch.zeros_like(h).masked_scatter(where, d.to(h.dtype)) for d in deep]
        positions = mrope_positions(input_ids, valid, cfg.image_token_id, cfg.merged_grid)
        cos, sin = mrope_tables(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
        mask, seen = padded_causal_mask(valid)
        layers = self.language_model.layers
        for i, layer in enumerate(layers):
            h = layer(h, cos, sin, mask, seen)
            if i < len(deep) and i < len(layers) - 1:
                h = h + deep[i]
        return BackboneOutput(features=h, image_mask=image_mask, attention_mask=valid)

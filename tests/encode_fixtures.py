"""Tiny encoders and a small shard folder for the `datakit encode` tests (nothing downloaded).

- `tiny_vae(folder, kind)`: an AutoencoderKLWan from a diffusers config, Wan2.1-style (z 16 -> 4,
  spatial 8) or Wan2.2-style (residual, patchify 2, spatial 16), every weight (norms included)
  drawn at random from a fixed seed, saved as safetensors;
- `tiny_text(folder)`: a UMT5EncoderModel from a config plus a word-level tokenizer built here;
- `tiny_clip(folder)`: a CLIPVisionModel (17 tokens of width 16) plus its image processor;
- `source`: 4 episodes of one 32x64 PNG camera converted into 3 shards.
Import the fixtures from here (`from encode_fixtures import encoders, source`).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

WORDS = ["pick", "up", "the", "cube", "open", "drawer", "a"]
LENGTHS = (13, 9, 11, 14)  # 5-frame clips: 2 + 1 + 2 + 2 at stride 1
CAMERA = "observation.images.top"


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every weight drawn from `seed` (no norm scale left at 1, no bias at 0): an oracle comparison
    that holds for these holds for any weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (0.5 if p.dim() == 1 else 0.0))


def tiny_vae(folder: Path, kind: str) -> Path:
    from diffusers import AutoencoderKLWan

    z = 4 if kind == "wan2.1" else 6
    extra = {} if kind == "wan2.1" else dict(is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                                             scale_factor_spatial=16, decoder_base_dim=8)
    vae = AutoencoderKLWan(base_dim=8, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           latents_mean=[0.0] * z, latents_std=[1.0] * z, **extra)
    _randomise(vae, 1 if kind == "wan2.1" else 2)
    vae.save_pretrained(folder, safe_serialization=True)
    return folder


def tiny_text(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    model = UMT5EncoderModel(UMT5Config(vocab_size=len(vocab), d_model=16, d_kv=8, num_heads=2, num_layers=2,
                                        d_ff=32, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1))
    _randomise(model, 3)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def tiny_clip(folder: Path) -> Path:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    model = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, image_size=32, patch_size=8))
    _randomise(model, 4)
    model.save_pretrained(folder, safe_serialization=True)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def encoders(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("encoders")
    return {"wan2.1": tiny_vae(root / "vae21", "wan2.1"), "wan2.2": tiny_vae(root / "vae22", "wan2.2"),
            "text": tiny_text(root / "text"), "image": tiny_clip(root / "clip")}


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> Path:
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("encode_src")
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=LENGTHS, height=32, width=64,
                               cameras=(CAMERA,), image_cameras=(CAMERA,), blank_cameras=(), state_dim=3, action_dim=2,
                               tasks=("pick up the cube", "open the drawer", "pick up a drawer"))
    out = root / "shards"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=20_000))
    return out

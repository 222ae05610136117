"""Tiny random encoders for a `datakit encode` smoke test, nothing downloaded: a Wan VAE (2.1- and
2.2-style), a umT5 text encoder with a word-level tokenizer, a CLIP vision encoder, each a few
thousand weights drawn from a fixed seed and saved where `datakit encode` reads them.

    python -m datakit.encode.tiny enc/        # enc/vae21, enc/vae22, enc/text, enc/clip (seconds, CPU)
    datakit encode shards/ features/ --vae enc/vae22 --text-encoder enc/text --clip 5 --size 32x64
    trainkit run dreamzero_tiny --set data.shards=features/   # (its VAE and text widths: docs/encode.md)

The features are noise in the shape of the real ones: they prove the pipeline (plan, encode, commit,
verify, load), not a model. Every weight, norms and biases included, is random (no scale left at 1,
no bias at 0), so an oracle comparison that holds for these holds for any weights: the encode tests
use the same ones (tests/fixtures/encode_fixtures.py). Needs the `encode` extra (diffusers, transformers).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

WORDS = ("pick", "up", "the", "cube", "open", "drawer", "a")  # the text tokenizer's words; others are <unk>
KINDS = ("wan2.1", "wan2.2")


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every weight drawn from `seed`: N(0, 0.2), vectors (norms, biases) around 0.5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (0.5 if p.dim() == 1 else 0.0))


def tiny_vae(folder: Path, kind: str) -> Path:
    """An AutoencoderKLWan: "wan2.1" (z 4, spatial 8) or "wan2.2" (residual, patchify 2, z 6, spatial 16)."""
    from diffusers import AutoencoderKLWan

    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    z = 4 if kind == "wan2.1" else 6
    extra = {} if kind == "wan2.1" else dict(is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                                             scale_factor_spatial=16, decoder_base_dim=8)
    vae = AutoencoderKLWan(base_dim=8, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           latents_mean=[0.0] * z, latents_std=[1.0] * z, **extra)
    randomise(vae, 1 if kind == "wan2.1" else 2)
    vae.save_pretrained(folder, safe_serialization=True)
    return Path(folder)


def tiny_text(folder: Path) -> Path:
    """A UMT5EncoderModel (width 16, 2 layers) and a word-level tokenizer over WORDS."""
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
    randomise(model, 3)
    model.save_pretrained(folder, safe_serialization=True)
    return Path(folder)


def tiny_clip(folder: Path) -> Path:
    """A CLIPVisionModel (17 tokens of width 16 at 32x32) and its image processor."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    model = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, image_size=32, patch_size=8))
    randomise(model, 4)
    model.save_pretrained(folder, safe_serialization=True)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return Path(folder)


def make_tiny_encoders(out: Path) -> dict[str, Path]:
    """All four under `out`: {"wan2.1", "wan2.2", "text", "image"} -> folder."""
    out = Path(out)
    return {"wan2.1": tiny_vae(out / "vae21", "wan2.1"), "wan2.2": tiny_vae(out / "vae22", "wan2.2"),
            "text": tiny_text(out / "text"), "image": tiny_clip(out / "clip")}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m datakit.encode.tiny OUT_FOLDER   (writes OUT/vae21, vae22, text, clip)", file=sys.stderr)
        return 2
    try:
        made = make_tiny_encoders(Path(args[0]))
    except ImportError as e:
        print(f"datakit.encode.tiny: needs the encode extra (pip install 'robodata[encode]'): {e}", file=sys.stderr)
        return 2
    for what, folder in made.items():
        print(f"{what:7s} {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`datakit encode SHARDS OUT --vae PATH [--text-encoder PATH] [--image-encoder PATH] --clip FRAMES[:STRIDE]
[--size HxW] [--dtype bfloat16] [--slots A,B,C --tile wrist_top]`: run the frozen encoders once over a
shard folder into a feature folder (docs/encode.md). Rerunning the same command resumes; bad flags
exit 2 with one line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from datakit.errors import ConfigError


def _clip(text: str) -> tuple[int, int]:
    frames, _, stride = text.partition(":")
    try:
        return int(frames), int(stride or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not FRAMES[:STRIDE] (e.g. 33 or 33:2)") from None


def _size(text: str) -> tuple[int, int]:
    h, _, w = text.lower().partition("x")
    try:
        return int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HxW (e.g. 352x640)") from None


def _slots(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(","))


def add_parser(sub) -> None:
    p = sub.add_parser("encode", help="encode a shard folder's clips, prompts and first frames once (VAE latents, "
                                      "text and image embeddings) into a verified feature folder",
                       description="Run frozen encoders (diffusers AutoencoderKLWan, transformers umT5 / CLIP, from "
                                   "local Hugging Face folders, safetensors only) over sampled clips of SHARDS and "
                                   "write a feature folder with the shards' contract. Rerunning resumes.")
    p.add_argument("shards", type=Path, help="a shard folder written by datakit convert")
    p.add_argument("out", type=Path, help="the feature folder (created; must be empty or a previous run's)")
    p.add_argument("--vae", type=Path, required=True, help="AutoencoderKLWan folder (Wan2.1 or Wan2.2 VAE)")
    p.add_argument("--text-encoder", type=Path, help="UMT5EncoderModel folder (tokenizer beside it or in ../tokenizer)")
    p.add_argument("--image-encoder", type=Path, help="CLIPVisionModel folder (processor in it or ../image_processor)")
    p.add_argument("--clip", type=_clip, required=True, metavar="FRAMES[:STRIDE]", help="frames per clip (1 + 4k)")
    p.add_argument("--size", type=_size, metavar="HxW", help="resize frames (bilinear) to the model's size")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--cond", choices=["none", "first-frame"], default="none",
                   help="first-frame: also store Wan2.1 I2V conditioning latents (VAE of [frame 0, zeros])")
    p.add_argument("--camera", help="source camera to encode (default: the first)")
    p.add_argument("--slots", type=_slots, default=(), metavar="CAM_A,CAM_B,CAM_C",
                   help="--tile: the canvas's cameras in canvas order (wrist first; default: the source's 3)")
    p.add_argument("--tile", metavar="MODE", help="wrist_top: encode the loader's tiled canvas of --slots "
                                                  "(DreamZero); --size is then the canvas's")
    p.add_argument("--seed", type=int, default=0, help="the clip list is a pure function of the seed")
    p.add_argument("--clips-per-episode", type=int, default=0, help="default: as many as fit without overlap")
    p.add_argument("--batch", type=int, default=1, help="clips per VAE call (GPU: 4-8)")
    p.add_argument("--workers", type=int, default=1, help="local processes (one GPU each where there are GPUs)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--engine", choices=["local", "ray"], default="local", help="local processes, or a Ray task per shard")
    p.add_argument("--ray-address", metavar="ADDR", help="--engine ray: join this cluster")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true", help="start over (removes only datakit's own files from OUT)")


def run(args) -> int:
    from datakit.encode import EncodeConfig, encode

    frames, stride = args.clip
    for flag, path in (("--vae", args.vae), ("--text-encoder", args.text_encoder),
                       ("--image-encoder", args.image_encoder)):
        if path is not None and not path.is_dir():
            raise ConfigError(flag, f"{path}: no such folder")
    cfg = EncodeConfig(vae=args.vae, text_encoder=args.text_encoder, image_encoder=args.image_encoder, frames=frames,
                       stride=stride, size=args.size, dtype=args.dtype, seed=args.seed,
                       clips_per_episode=args.clips_per_episode, camera=args.camera, slots=args.slots,
                       tile=args.tile, cond=args.cond, batch=args.batch, workers=args.workers, engine=args.engine,
                       ray_address=args.ray_address, device=args.device, progress=not args.no_progress)
    s = encode(args.shards, args.out, cfg, force=args.force, command=" ".join(["datakit", *sys.argv[1:]]))
    fi = s.index
    state = "already complete; nothing to do" if s.already_complete else \
        f"{s.seconds:.1f} s" + (f", kept {s.resumed_shards} complete shard(s)" if s.resumed_shards else "")
    shapes = ", ".join(f"{k} {'x'.join(map(str, f.shape))} {f.dtype}" for k, f in fi.fields.items())
    print(f"{args.out}: {fi.num_clips} clips in {fi.num_shards} shards ({shapes}; {len(fi.prompts)} prompts) - {state}")
    return 0

"""Encode throughput and the DreamZero-5B step with the frozen encoders in the loop vs reading the cache
(issue 30's benchmark), on one GPU, with random weights of the real shapes (nothing downloaded).

    python3 bench/data/bench_encode_gpu.py --out $OUT/encode.json                 # one H200: both parts
    python3 bench/data/bench_encode_gpu.py --out $OUT/step.json --parts step --iters 3   # the step part alone
    python3 bench/data/bench_encode_gpu.py --out /tmp/encode_cpu.json --cpu       # tiny shapes, CPU: the same path

The GPU machine has torch, transformers and safetensors but not diffusers: the pure-Python wheel travels
(`.whl/encode/diffusers-0.42.1-py3-none-any.whl`, carried) and is installed with --no-deps when `import
diffusers` fails (it also needs Pillow, importlib_metadata: named in one line if missing).

1. encode: the Wan2.2 VAE (diffusers AutoencoderKLWan at the Wan2.2-TI2V-5B config: base 160, z 48,
   residual, patchify 2, spatial 16) in bf16, `encode(x).latent_dist.mode()` of B clips of 33 frames at
   352x640 and 160x320 (the datakit encode path: `datakit.encode.models.to_vae_input` resizes uint8 frames
   first), clips/s over `--iters` timed calls after a warm-up, for each --batch;
2. step: trainkit's DreamZero `5b` preset (Wan2.2-TI2V-5B's DiT plus the I2V image cross-attention
   DreamZero adds, and its action/state tokens) trained in bf16 with AdamW (bf16 weights and states, no
   fp32 master: the optimiser step is cheaper than a trainer's, so the ratio leans high) on one 33x352x640
   clip per sample. "cache" = the feature adapter's batch (`DreamZeroFeatureBatches.model_batch`: latents
   normalised by the VAE's mean/std, text padded to 512, CLIP features) + forward + backward + optimiser
   step, from cached latents (48 x 9 x 22 x 40), umT5 text (512 x 4096) and CLIP (257 x 1280) features;
   "in the loop" = the same step after running the VAE on the clip, umT5-XXL (transformers
   UMT5EncoderModel, 4096 x 24 layers) on 512 tokens (an upper bound: the cache holds a prompt's real
   tokens) and CLIP ViT-H/14 (CLIPVisionModel, 1280 x 32 layers, penultimate layer) on the first frame
   (bilinear to 224, scaled to [-1, 1]). CLIP runs because the 5b preset, as DreamZero's, has the image
   cross-attention (`k_img`, `v_img`, `img_emb`) that the plain Wan2.2-TI2V-5B lacks. Ratio = in-the-loop
   step time / cache step time; `--iters` timed calls after one warm-up each (3: the part takes well
   under two minutes on an H200).
Random weights: every norm scale (the VAE's RMS gammas, LayerNorm / T5 norm weights) N(1, 0.1), not all 1;
every other matrix or conv kernel N(0, 1/fan_in); biases and other vectors N(0, 0.02).
"""
from __future__ import annotations

import argparse
import glob
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.record import header  # noqa: E402

WAN22_VAE = dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                 attn_scales=[], temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                 out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                 latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
TINY_VAE = dict(WAN22_VAE, base_dim=8, decoder_base_dim=8, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                latents_mean=[0.0] * 8, latents_std=[1.0] * 8)  # the tiny preset: 8 latent channels
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                feed_forward_proj="gated-gelu", relative_attention_num_buckets=32)
TINY_UMT5 = dict(UMT5_XXL, vocab_size=64, d_model=24, d_kv=8, d_ff=32, num_layers=1, num_heads=3)
CLIP_H = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16, image_size=224,
              patch_size=14, hidden_act="gelu")
TINY_CLIP = dict(CLIP_H, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 image_size=32, patch_size=8)


def import_diffusers():
    """diffusers, installed from the carried wheel (--no-deps) when it is not importable."""
    try:
        return importlib.import_module("diffusers")
    except ImportError:
        wheels = sorted(glob.glob(str(ROOT / ".whl" / "**" / "diffusers-*.whl"), recursive=True))
        if not wheels:
            sys.exit("bench_encode_gpu: no diffusers and no .whl/**/diffusers-*.whl to install (pip download "
                     "--no-deps diffusers==0.42.1 -d .whl/encode, and carry .whl/encode)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheels[-1]], check=True)
        importlib.invalidate_caches()
        try:
            return importlib.import_module("diffusers")
        except ImportError as e:
            sys.exit(f"bench_encode_gpu: diffusers installed but does not import: {e} (install that package too)")


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int) -> None:
    """Matrices N(0, 1/fan_in), 1-D norm weights N(1, 0.1), other vectors N(0, 0.02)."""
    g = None
    for name, p in model.named_parameters():
        if g is None:  # drawn where the weights are (5.7B umT5 values on a CPU generator take minutes)
            g = torch.Generator(device=p.device).manual_seed(seed)
        v = torch.randn(p.shape, generator=g, device=p.device)
        if name.endswith("bias"):
            v *= 0.02
        elif "norm" in name or name.endswith("gamma"):  # the Wan VAE's RMS gammas are (C, 1, 1[, 1])
            v = 1.0 + 0.1 * v
        elif p.dim() >= 2:
            v *= p[0].numel() ** -0.5
        else:
            v *= 0.02
        p.copy_(v.to(p.dtype))


def timed(fn, iters: int, sync) -> float:
    """Median seconds of `iters` calls after one warm-up."""
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_encode(vae, shapes, batches, iters, device, dtype, sync) -> list[dict]:
    from datakit.encode.models import to_vae_input

    rows = []
    for (t, h, w) in shapes:
        for b in batches:
            frames = torch.randint(0, 256, (b, t, h, w, 3), dtype=torch.uint8, device=device)

            def run():
                with torch.inference_mode():
                    return vae.encode(to_vae_input(frames, (h, w)).to(dtype)).latent_dist.mode()

            try:
                s = timed(run, iters, sync)
                rows.append({"frames": t, "height": h, "width": w, "batch": b, "seconds_per_call": s,
                             "clips_per_s": b / s, "latent_shape": list(run().shape[1:])})
            except torch.OutOfMemoryError:
                rows.append({"frames": t, "height": h, "width": w, "batch": b, "status": "oom"})
                torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
    return rows


def feature_adapter(cfg, vae_config: dict):
    """trainkit's feature adapter for a cache of this VAE and these encoders (the index fields it checks)."""
    from types import SimpleNamespace

    from trainkit.models.dreamzero.batches import DreamZeroFeatureBatches

    lat = [cfg.latent_channels, cfg.latent_frames, *cfg.latent_hw]
    index = SimpleNamespace(fingerprint={"frames": cfg.frames, "size": list(cfg.canvas), "tile": "wrist_top"},
                            span=cfg.horizon,
                            fields={"latents": SimpleNamespace(shape=lat),
                                    "image": SimpleNamespace(shape=[cfg.image_tokens, cfg.image_width])},
                            vae={k: vae_config[k] for k in ("latents_mean", "latents_std")}, text_width=cfg.text_width)
    return DreamZeroFeatureBatches(cfg, index, "bench")


def bench_step(vae, vae_config: dict, args, device, dtype, sync) -> dict:
    """DreamZero step time: cached features vs the encoders in the loop."""
    import torch.nn.functional as F
    import transformers
    from datakit.encode.models import to_vae_input
    from trainkit.models.dreamzero.config import PRESETS
    from trainkit.models.dreamzero.model import DreamZero

    cfg = PRESETS["tiny" if args.cpu else "5b"]()
    with torch.device(device):  # each converted at once: fp32 copies of the DiT and umT5 never coexist
        model = DreamZero(cfg).to(dtype)
        umt5 = transformers.UMT5EncoderModel(transformers.UMT5Config(**(TINY_UMT5 if args.cpu else UMT5_XXL)))
        umt5 = umt5.to(dtype).eval().requires_grad_(False)
        clip = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**(TINY_CLIP if args.cpu else CLIP_H)))
        clip = clip.to(dtype).eval().requires_grad_(False)
    randomise(umt5, 1)
    randomise(clip, 2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)
    adapter = feature_adapter(cfg, vae_config)
    b, (h, w), side = args.micro_batch, cfg.canvas, clip.config.image_size
    frames = torch.randint(0, 256, (b, cfg.frames, h, w, 3), dtype=torch.uint8, device=device)
    ids = torch.randint(1, umt5.config.vocab_size, (b, cfg.text_len), device=device)
    host = {"state": torch.randn(b, 8), "action": torch.randn(b, cfg.horizon, 7),
            "text_mask": torch.ones(b, cfg.text_len, dtype=torch.bool)}
    host = adapter.extras(host, torch.Generator().manual_seed(0))  # the flow draws, once
    host = {k: v.to(device) for k, v in host.items()}

    def encoders():
        """The VAE on the clip, umT5 on 512 tokens, CLIP on the first frame (bilinear to 224, [-1, 1])."""
        with torch.inference_mode():
            lat = vae.encode(to_vae_input(frames, (h, w)).to(dtype)).latent_dist.mode()
            text = umt5(input_ids=ids).last_hidden_state
            first = F.interpolate(frames[:, 0].permute(0, 3, 1, 2).float(), size=(side, side), mode="bilinear")
            image = clip(pixel_values=(first / 127.5 - 1).to(dtype), output_hidden_states=True).hidden_states[-2]
        return {"latents": lat.clone(), "text": text.clone(), "image": image.clone()}

    cached = encoders()
    assert cached["latents"].shape[1:] == (cfg.latent_channels, cfg.latent_frames, *cfg.latent_hw), cached["latents"].shape
    assert cached["image"].shape[1:] == (cfg.image_tokens, cfg.image_width), cached["image"].shape

    def step(features):
        loss = model(adapter.model_batch({**host, **features}))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cache_s = timed(lambda: step(cached), args.iters, sync)
    encoders_s = timed(encoders, args.iters, sync)
    loop_s = timed(lambda: step(encoders()), args.iters, sync)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"preset": "tiny" if args.cpu else "5b", "micro_batch": b, "clip": [cfg.frames, h, w],
            "params": sum(p.numel() for p in model.parameters()), "step_cache_s": cache_s, "encoders_s": encoders_s,
            "step_in_loop_s": loop_s, "ratio_in_loop_over_cache": loop_s / cache_s, "peak_mem_gib": peak}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON written")
    p.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (a dry run of the same path)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="clips per VAE call (encode part)")
    p.add_argument("--iters", type=int, default=5, help="timed calls per measurement (after one warm-up)")
    p.add_argument("--micro-batch", type=int, default=1, help="samples per training step (step part)")
    p.add_argument("--parts", nargs="+", choices=["encode", "step"], default=["encode", "step"],
                   help="which parts run (--parts step: the step comparison alone)")
    args = p.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_encode_gpu: no CUDA device (use --cpu for the dry run)")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    diffusers = import_diffusers()
    diffusers.utils.logging.set_verbosity_error()
    vae_config = TINY_VAE if args.cpu else WAN22_VAE
    with torch.device(device):
        vae = diffusers.AutoencoderKLWan(**vae_config)
    vae = vae.to(dtype).eval().requires_grad_(False)
    randomise(vae, 0)
    shapes = [(9, 32, 64), (9, 64, 128)] if args.cpu else [(33, 352, 640), (33, 160, 320)]
    doc = {"schema": "bench.encode/1", "mode": device, **header(), "diffusers": diffusers.__version__}
    if "encode" in args.parts:
        doc["encode"] = bench_encode(vae, shapes, args.batch, args.iters, device, dtype, sync)
    if "step" in args.parts:
        doc["step"] = bench_step(vae, vae_config, args, device, dtype, sync)
        print(json.dumps(doc["step"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

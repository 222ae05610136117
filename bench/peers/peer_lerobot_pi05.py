"""The peer a user would pick: LeRobot 0.6.1's own `PI05Policy` training step, timed on the GPU.

    python3 bench/peers/peer_lerobot_pi05.py --out $OUT/lerobot_pi05.json                    # its best setting
    python3 bench/peers/peer_lerobot_pi05.py --out X.json --settings fp32_autocast_ckpt bf16_ckpt --batch 32

Needs lerobot 0.6.1 importable (the device has torch, transformers, safetensors, numpy; its other
imports travel as wheels installed with --no-deps: lerobot, draccus, mergedeep, typing-inspect,
mypy-extensions, einops, gymnasium, torchvision; bench/results/pi05_h200.md has the command).
`lerobot.policies` imports every policy, and only GR00T's processor imports OpenCV (60 MB): where
`cv2` is missing an empty module stands in for it; nothing on the PI05 path touches it.

The step, as LeRobot's trainer takes it but on synthetic inputs already on the GPU (no data
loading, no tokenizer): `policy.model.forward(images, img_masks, tokens, masks, actions, noise,
time)` -> per-element losses, their mean, backward, `clip_grad_norm_(1.0)`, fused AdamW, zero_grad.
Inputs: 2 cameras at 224x224 in [-1, 1] (both present), a 200-token prompt with a padded tail,
a 50 x 32 action chunk, Gaussian noise, time in (0, 1). Settings (`SETTINGS`): the policy's
`dtype` and `gradient_checkpointing`, and whether float32 weights run under bf16 autocast.
Samples/s = batch / median step time over the steps after `--skip`; MFU from trainkit's analytic
FLOP count of the same shapes (trainkit.models.pi05.flops, 2 image slots) / 989 TFLOP/s.
Output: one JSON object {"settings": [{name, status, samples_per_s, mfu, step_time_s, peak_mem_gib,
losses, error}], ...}, rewritten after each setting.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.peers.peer_report import run_settings  # noqa: E402

PEAK = 989e12  # H100/H200 dense bf16
SETTINGS = {  # name -> (PI05Config.dtype, gradient_checkpointing, bf16 autocast)
    "fp32_autocast_ckpt": ("float32", True, True),  # its best on an H200 so far: 22.02 samples/s at batch 32
    "bf16_ckpt": ("bfloat16", True, False),
    "bf16": ("bfloat16", False, False),  # ran out of memory at batch 32 on an H200
}
CAMERAS = ("observation.images.top", "observation.images.wrist")
PROMPT = (150, 200)  # real tokens per sample (alternating), of tokenizer_max_length 200


def build(name: str, device: Any) -> Any:
    import torch
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    dtype, ckpt, _ = SETTINGS[name]
    feats = {c: PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224)) for c in CAMERAS}
    feats["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(8,))
    cfg = PI05Config(device=str(device), dtype=dtype, gradient_checkpointing=ckpt, push_to_hub=False,
                     input_features=feats,
                     output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(7,))})
    with torch.device(device):  # random init on the GPU: on the host it takes minutes at 3.3B parameters
        policy = PI05Policy(cfg)
    policy.to(device).train()
    return policy


def inputs(batch: int, device: Any, seed: int) -> tuple:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    images = [torch.rand(batch, 3, 224, 224, generator=g).mul(2).sub(1).to(device) for _ in CAMERAS]
    img_masks = [torch.ones(batch, dtype=torch.bool, device=device) for _ in CAMERAS]
    tokens = torch.randint(1, 257_000, (batch, 200), generator=g)
    masks = torch.zeros(batch, 200, dtype=torch.bool)
    for i in range(batch):
        n = PROMPT[i % 2]
        masks[i, :n] = True
        tokens[i, n:] = 0
    actions = torch.randn(batch, 50, 32, generator=g)
    actions[..., 7:] = 0  # the robot's 7 channels, zero-padded as LeRobot pads them
    noise = torch.randn(batch, 50, 32, generator=g)
    t = torch.rand(batch, generator=g).mul(0.998).add(0.001)
    return images, img_masks, tokens.to(device), masks.to(device), actions.to(device), noise.to(device), t.to(device)


def run_setting(name: str, batch: int, steps: int, skip: int) -> dict[str, Any]:
    import torch

    from trainkit.models import build_config
    from trainkit.models.pi05.flops import flops_per_sample

    device = torch.device("cuda")
    rec: dict[str, Any] = {"name": name, "batch": batch, "steps": steps, "skip": skip,
                           "dtype": SETTINGS[name][0], "gradient_checkpointing": SETTINGS[name][1],
                           "autocast_bf16": SETTINGS[name][2]}
    torch.cuda.reset_peak_memory_stats()
    policy = opt = None
    try:
        t0 = time.perf_counter()
        policy = build(name, device)
        rec["build_s"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: built in {rec['build_s']} s", flush=True)
        params = [p for p in policy.parameters() if p.requires_grad]
        rec["params"] = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(params, lr=2.5e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, fused=True)
        x = inputs(batch, device, 0)
        times, losses = [], []
        for step in range(steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=SETTINGS[name][2]):
                loss = policy.model.forward(*x).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))  # the step's end: a host sync, as LeRobot's trainer logs it
            times.append(time.perf_counter() - t)
        step_s = statistics.median(times[skip:])
        flops = flops_per_sample(build_config("pi05", "full", {}), len(CAMERAS))
        rec.update(status="ok", step_time_s=step_s, samples_per_s=batch / step_s, mfu=batch * flops / step_s / PEAK,
                   peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30, losses=losses, step_times_s=times)
    except torch.OutOfMemoryError as e:
        rec.update(status="oom", error=str(e).splitlines()[0])
    except Exception as e:  # noqa: BLE001 - recorded; the next setting still runs
        rec.update(status="crash", error=f"{type(e).__name__}: {e}"[:2000])
    finally:
        del policy, opt
        torch.cuda.empty_cache()
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["fp32_autocast_ckpt"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    args = p.parse_args(argv)
    if args.steps <= args.skip:
        raise SystemExit(f"bench/peers/peer_lerobot_pi05.py: --steps {args.steps} must exceed --skip {args.skip}")
    import torch

    return run_settings(args.out, args.settings, lambda name: run_setting(name, args.batch, args.steps, args.skip),
                        torch.cuda.get_device_name())

if __name__ == "__main__":
    sys.exit(main())

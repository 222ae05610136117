"""DreamZero `5b` on one H200: `baseline` and `optimised` through `trainkit run` from real shards
through the loader, the probe's best setting in the same call, the block-causal attention kernels
at the 5b shapes, one `14b` block forward + backward, and `trainkit inspect` of `14b` at 1/2/8 GPUs.

    python3 bench/bench_dreamzero_gpu.py --out $OUT                  # everything, one device call
    python3 bench/bench_dreamzero_gpu.py --out /tmp/x --cpu          # dry run: tiny preset on the CPU

Shards: the machine has no video decoder, so a LeRobot v2.1 dataset with three PNG image columns
(wrist + two exterior views, 176x320) is generated (`datakit.synth.make_lerobot_dataset`) and
converted by `datakit.convert`; the loader tiles the views into the 352x640 canvas on the GPU. Each
trainer variant is its own `torchrun` (an OOM costs that variant only) under the call's time
budget; the probe (`bench/probes/dreamzero_probe.py`, a verbatim copy of ../shared/probes/) runs
its best setting. Steady state = median of the metric intervals from step `--skip` on (compile and
warm-up before; the profiled steps 5-6 of `optimised` too). Results: `$OUT/dreamzero_gpu.json`,
rewritten after every part.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIGS = ROOT / "trainkit" / "configs"
PROBE = ROOT / "bench" / "probes" / "dreamzero_probe.py"
CAMS = ("observation.images.wrist", "observation.images.exterior_1", "observation.images.exterior_2")
PROBE_BEST = "compile_mbs4_noac"  # the best probe setting: per-block, compiled, no recompute, micro-batch 4


def make_shards(root: Path, view: tuple[int, int], episodes: int, length: int) -> Path:
    """Generated 3-camera dataset (PNG frames, no codec) -> datakit convert -> shard folder."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.machine import available_cpus
    from datakit.synth import make_lerobot_dataset

    out = root / "shards"
    if (out / "checksums.json").exists():
        return out
    shutil.rmtree(root, ignore_errors=True)
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=(length,) * episodes, height=view[0],
                               width=view[1], cameras=CAMS, image_cameras=CAMS, blank_cameras=(), state_dim=8,
                               action_dim=7, tasks=("pick up the red cube and put it in the bowl", "open the top drawer"))
    convert(src, out, ConvertConfig(workers=min(8, available_cpus()), progress=False))
    shutil.rmtree(root / "src")
    return out


def run_variant(name: str, config: Path, sets: list[str], args, budget_end: float) -> dict:
    out_dir = args.work / "runs" / name
    shutil.rmtree(out_dir, ignore_errors=True)
    sets = [f"data.shards={args.shards}", f"output.dir={out_dir}", f"train.steps={args.steps}",
            f"output.log_every={args.log_every}", "output.progress=false", "output.resume=false", *sets]
    if args.cpu:
        sets += ["model.preset=tiny", "parallel.param_dtype=float32", "parallel.compile=false", "train.micro_batch=2",
                 "data.num_workers=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "-m", "trainkit.cli", "run",
           str(config), *[x for s in sets for x in ("--set", s)]]
    res: dict = {"variant": name, "config": config.name, "sets": sets[6:],
                 "command": " ".join(["python3", *cmd[1:]])}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(10.0, min(args.variant_timeout, budget_end - time.time())),
                              env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
        res["rc"], tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        res["rc"] = "timeout"
        tail = ((e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"))[-3000:]
    res["wall_s"] = round(time.time() - t0, 1)
    lines = []
    if (out_dir / "metrics.jsonl").exists():
        lines = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    history = [x for x in lines if x["kind"] == "interval"]
    res["losses"] = [round(x["loss"], 5) for x in lines if x["kind"] == "step"]
    if history:
        from trainkit.observe.summary import steady_state
        res["steady"], res["history"] = steady_state(history, args.skip), history
    if (out_dir / "profile_rank0.json").exists():
        res["profile"] = json.loads((out_dir / "profile_rank0.json").read_text())
    if res["rc"] != 0 or not history:
        res["error_tail"] = "OOM" if "OutOfMemoryError" in tail else tail[-1500:]
    print(json.dumps({k: v for k, v in res.items() if k not in ("history", "command", "profile")}), flush=True)
    return res


def run_probe(variant: str, budget_end: float) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", str(PROBE), variant]
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, budget_end - time.time())).stdout
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace")
    out = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    print(json.dumps(out), flush=True)
    return out


def inspect_14b(cpu: bool) -> dict:
    """`trainkit inspect` of 14b (micro-batch 1, every block recomputed) at 1, 2 and 8 GPUs."""
    out = {}
    for world in (1, 2, 8):
        cmd = [sys.executable, "-m", "trainkit.cli", "inspect", str(CONFIGS / "dreamzero_5b_optimised.toml"), "--set",
               "model.preset=14b", "--set", "train.micro_batch=1", "--set", "parallel.ac_stride={blocks = 1}", "--json",
               "--world-size", str(world)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        out[str(world)] = {"command": " ".join(["python3", *cmd[1:]]), **json.loads(proc.stdout)}
    return out


def timed(fn, device: str, warmup: int = 3, iters: int = 10) -> float:
    """Mean ms of fn() over `iters` after `warmup`: CUDA events on the GPU, the wall clock on the CPU."""
    import torch
    for _ in range(warmup):
        fn()
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def attention_kernels(batch: int, preset: str = "5b", device: str = "cuda") -> dict:
    """fwd+bwd of the block-causal self-attention at the preset's shapes, each kernel, against full
    attention (the CPU dry run: tiny, without the CUDA-only backends)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from trainkit.models.dreamzero import PRESETS, TokenSequence
    from trainkit.models.dreamzero.attention import block_causal_attention

    cfg = PRESETS[preset]()
    seq = TokenSequence.of(cfg)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, seq.total, cfg.heads, cfg.head_dim, device=device, dtype=torch.bfloat16,
                           generator=g).requires_grad_(True) for _ in range(3))
    grad = torch.randn(batch, seq.total, cfg.dim, device=device, dtype=torch.bfloat16, generator=g)
    ref = block_causal_attention(q.float(), k.float(), v.float(), seq, "dense")
    flop = 3 * 4 * batch * seq.attended_pairs * cfg.dim  # fwd + bwd of the block-causal work
    out = {"batch": batch, "tokens": seq.total, "pairs_fraction": round(seq.attended_pairs / seq.total ** 2, 4)}
    cases = {"blocks_default": ("blocks", None), "blocks_flash": ("blocks", SDPBackend.FLASH_ATTENTION),
             "blocks_cudnn": ("blocks", SDPBackend.CUDNN_ATTENTION),
             "blocks_efficient": ("blocks", SDPBackend.EFFICIENT_ATTENTION), "flex": ("flex", None),
             "dense_mask": ("dense", None), "full_no_mask": ("full", None)}
    if device != "cuda":
        cases = {k_: c for k_, c in cases.items() if k_ in ("blocks_default", "dense_mask", "full_no_mask")}
    for name, (kernel, backend) in cases.items():
        def step():
            if kernel == "full":
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
                o = o.transpose(1, 2).reshape(batch, seq.total, -1)
            else:
                o = block_causal_attention(q, k, v, seq, kernel)
            o.backward(grad)
            return o
        try:
            with sdpa_kernel(backend) if backend is not None else _null():
                ms = timed(step, device)
                err = None if kernel == "full" else float((step().detach().float() - ref).abs().max())
            out[name] = {"fwd_bwd_ms": round(ms, 3), "block_causal_tflops": round(flop / ms / 1e9, 1), "max_abs_err": err}
        except Exception as e:  # noqa: BLE001 - a kernel that does not run here is a result too
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        q.grad = k.grad = v.grad = None
        print(name, json.dumps(out[name]), flush=True)
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def block_timing(preset: str = "14b", device: str = "cuda") -> dict:
    """Forward + backward of one DiT block of `preset` over one sample (14b: 15,060 tokens), bf16, eager."""
    import torch
    from trainkit.models.dreamzero import PRESETS, TokenSequence
    from trainkit.models.dreamzero.flops import block_forward
    from trainkit.models.dreamzero.model import WanBlock

    cfg = PRESETS[preset]()
    seq = TokenSequence.of(cfg)
    torch.manual_seed(0)
    block = WanBlock(cfg, seq).to(device, torch.bfloat16)
    for name, p in block.named_parameters():
        torch.nn.init.normal_(p, std=0.02 if p.dim() > 1 else 1.0) if "norm" not in name else torch.nn.init.ones_(p)
    x = torch.randn(1, seq.total, cfg.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    ctx = torch.randn(1, cfg.context_tokens, cfg.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    mod = (0.1 * torch.randn(1, cfg.blocks + 1, 6, cfg.dim, device=device, dtype=torch.bfloat16)).requires_grad_(True)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = timed(lambda: block(x, ctx, mod).sum().backward(), device, warmup=2, iters=5)
    flop = 3 * block_forward(cfg)
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None
    return {"preset": preset, "tokens": seq.total, "params": sum(p.numel() for p in block.parameters()),
            "fwd_bwd_ms": round(ms, 2), "tflops": round(flop / ms / 1e9, 3), "mfu": round(flop / ms / 1e-3 / 989e12, 4),
            "flop_fwd_bwd": flop, "peak_gib": None if peak is None else round(peak, 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--baseline-steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=8, help="steps left out of steady state (compile, warm-up, profile)")
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=400, help="stop starting parts after this")
    p.add_argument("--variant-timeout", type=float, default=240)
    p.add_argument("--candidates", nargs="*", default=["accum2"], help="extra variants if time is left: accum2 mbs3")
    p.add_argument("--work", type=Path, default=Path("/tmp/dreamzero_bench"))
    p.add_argument("--cpu", action="store_true", help="dry run of the same path: tiny preset on the CPU")
    args = p.parse_args()
    budget_end = time.time() + args.budget_s
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(["python3", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "torch": torch.__version__, "variants": [],
           "dev_shm_gib": round(shutil.disk_usage("/dev/shm").total / 2 ** 30, 1) if Path("/dev/shm").exists() else None}
    dump = lambda: (args.out / "dreamzero_gpu.json").write_text(json.dumps(res, indent=1) + "\n")  # noqa: E731
    t0 = time.time()
    view = (32, 64) if args.cpu else (176, 320)
    args.shards = make_shards(args.work / "data", view, episodes=4, length=64)
    res["shards_s"] = round(time.time() - t0, 1)
    res["inspect_14b"] = inspect_14b(args.cpu)
    dump()

    def go(name: str, cfg: str, sets: list[str], min_s: float = 20) -> dict:
        if time.time() > budget_end - min_s:  # a variant that cannot finish is not started
            r = {"variant": name, "rc": "skipped: out of time budget"}
        else:
            r = run_variant(name, CONFIGS / cfg, sets, args, budget_end)
        res["variants"].append(r)
        dump()
        return r

    opt = go("optimised", "dreamzero_5b_optimised.toml", ["output.profile_steps=2"])
    if opt.get("error_tail") == "OOM":
        go("optimised_mbs3", "dreamzero_5b_optimised.toml", ["train.micro_batch=3", "output.profile_steps=2"])
    if not args.cpu:
        res["probe"] = run_probe(PROBE_BEST, budget_end)
        dump()
    go("baseline", "dreamzero_5b_baseline.toml", [f"train.steps={args.baseline_steps}", "output.profile_steps=2"])
    dev, preset = ("cpu", "tiny") if args.cpu else ("cuda", "5b")
    if time.time() < budget_end - 30:
        res["attention"] = attention_kernels(batch=4, preset=preset, device=dev)
        dump()
    if time.time() < budget_end - 20:
        try:
            res["block_14b"] = block_timing("tiny" if args.cpu else "14b", dev)
        except Exception as e:  # noqa: BLE001 - recorded, the rest of the call goes on
            res["block_14b"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        dump()
    extra = {"accum2": ["train.global_batch=8"], "mbs3": ["train.micro_batch=3"]}
    for name in args.candidates:
        go(f"optimised_{name}", "dreamzero_5b_optimised.toml", extra[name], min_s=70)
    dump()
    print(f"{'variant':20} {'ms/step':>8} {'samples/s':>10} {'MFU %':>6} {'peak GiB':>9} {'wait %':>7}")
    for v in res["variants"]:
        s = v.get("steady")
        if s:
            mfu = 100 * s["mfu"] if s.get("mfu") is not None else float("nan")
            peak = s["peak_mem_gib"] if s.get("peak_mem_gib") is not None else float("nan")
            print(f"{v['variant']:20} {s['step_time_s'] * 1e3:8.0f} {s['samples_per_s_gpu']:10.2f} {mfu:6.1f} "
                  f"{peak:9.1f} {100 * s['data_wait_frac']:7.2f}")
        else:
            print(f"{v['variant']:20} {v.get('rc')} {v.get('error_tail', '')[-300:]!r}")
    for pr in res.get("probe", []):
        print("probe", json.dumps(pr))
    print("block_14b", json.dumps(res.get("block_14b", {})))


if __name__ == "__main__":
    main()

"""trainkit on the GPU machine: Pi0.5 `full` on all local GPUs from real shards through the loader,
`baseline` then `optimised`, the probe's best setting in the same call, and an ablation that turns
each switch off alone from `optimised`.

    python3 bench/bench_trainkit_gpu.py --out $OUT --main                  # baseline, optimised (+profiles), probe
    python3 bench/bench_trainkit_gpu.py --out $OUT --candidates mbs40 keep_params --ablate all
        # tuning candidates (optimised + a change), then the ablation against the fastest of them
    python3 bench/bench_trainkit_gpu.py --out /tmp/x --main --cpu         # dry run: tiny preset, 2 gloo procs
    python3 bench/bench_trainkit_gpu.py --out $OUT --optimised --candidates mbs48 nccl_ctas8   # env candidates too

Beside it: `bench/bench_attention_gpu.py` (the joint attention's mask options at training shapes) and
`bench/probes/profile_probe.py` (the probe under the same profiler, optionally with norm weights 1).

Shards: the machine has no video decoder, so the dataset is generated with PNG image columns
(`datakit.synth.make_lerobot_dataset(image_cameras=...)`) and converted by `datakit.convert`
(PIL decodes): 2 real cameras at 224x224 rgb, mapped to Pi0.5's 3 slots with the third unfilled.
Each variant runs as its own `torchrun` (a crash or OOM costs that variant only) under a time
budget; results are rewritten to `$OUT/trainkit_<phase>.json` after every variant. Steady state =
median over the metric intervals after the first `--skip` steps (compilation, warm-up).
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
CAMS = ("observation.images.top", "observation.images.wrist")
PROBE = ROOT / "bench" / "probes" / "pi05_fsdp_probe.py"

TUNE = {  # optimised plus one change, tried before fixing the optimised config ("env:K=V" sets a variable)
    "mbs40": ["train.micro_batch=40"],
    "mbs32": ["train.micro_batch=32"],
    "mbs48": ["train.micro_batch=48"],
    "mbs56": ["train.micro_batch=56"],
    "nccl_ctas8": ["env:NCCL_MAX_CTAS=8"],  # fewer SMs taken from the GEMMs by hidden collectives
    "nccl_ctas4": ["env:NCCL_MAX_CTAS=4"],
    "autotune_gemm": ["env:TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1"],  # inductor times cuBLAS vs Triton per GEMM shape
    "coord_descent": ["env:TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1"],  # tuned launch configs of fused kernels
    "keep_params": ["parallel.reshard_after_forward=false"],
    "fp8": ["train.micro_batch=32"],  # optimised as configured (varlen + FP8 GeGLU) at mbs 32: one GPU
    "bf16": ["train.micro_batch=32", "parallel.float8_modules=[]"],  # optimised without FP8 (mbs 32: one GPU)
    "masked_bf16": ["train.micro_batch=32", "parallel.float8_modules=[]", "parallel.attention=masked"],
    "fp8_all_lm": ["train.micro_batch=32", 'parallel.float8_modules=["lm_layers.*.lm.*"]'],
    "mbs40_keep": ["train.micro_batch=40", "parallel.reshard_after_forward=false"],
}
ABLATION = {  # optimised with one switch turned off
    "no_per_block_fsdp": ["parallel.fsdp=root"],
    "no_grouping": ["parallel.group={vision_blocks = 1, lm_layers = 1}"],
    "no_prefetch": ["parallel.prefetch=false"],
    "recompute_all": ["parallel.ac_stride={vision_blocks = 1, lm_layers = 1}"],
    "no_compile": ["parallel.compile=false"],
    "no_fused_adamw": ["optim.fused=false"],
    "no_slot_pruning": ["data.prune_slots=false"],
    "float32_h2d": ["data.h2d_dtype=float32"],
    "no_expandable_segments": ["parallel.expandable_segments=false"],
}


def make_shards(root: Path, size: int, episodes: int, length: int) -> Path:
    """Generated dataset (PNG frames, no codec) -> datakit convert -> shard folder."""
    from datakit.convert.config import ConvertConfig
    from datakit.machine import available_cpus
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    out = root / "shards"
    if (out / "checksums.json").exists():
        return out
    shutil.rmtree(root, ignore_errors=True)
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=(length,) * episodes, height=size,
                               width=size, cameras=(), image_cameras=CAMS, blank_cameras=(), state_dim=8,
                               action_dim=7, tasks=("pick up the red cube and put it in the bowl",
                                                    "open the top drawer"))
    convert(src, out, ConvertConfig(workers=min(8, available_cpus()), progress=False))
    shutil.rmtree(root / "src")
    return out


def steady(history: list[dict], skip: int) -> dict:
    """Median of each interval metric over intervals that start at or after step `skip`."""
    from trainkit.observe.summary import steady_state
    return steady_state(history, skip)


def run_variant(name: str, config: Path, sets: list[str], args, run_root: Path, budget_end: float) -> dict:
    out_dir = run_root / name
    shutil.rmtree(out_dir, ignore_errors=True)
    env = dict(x[4:].split("=", 1) for x in sets if x.startswith("env:"))
    sets = [x for x in sets if not x.startswith("env:")]
    sets = [f"data.shards={args.shards}", f"output.dir={out_dir}", f"train.steps={args.steps}",
            f"output.log_every={args.log_every}", "output.progress=false", "output.resume=false", *sets]
    if args.cpu:
        sets += ["model.preset=tiny", "parallel.param_dtype=float32", "parallel.compile=false", "train.micro_batch=4",
                 "parallel.float8_modules=[]",
                 "data.num_workers=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}", "-m", "trainkit.cli", "run",
           str(config), *[x for s in sets for x in ("--set", s)]]
    timeout = max(10.0, min(args.variant_timeout, budget_end - time.time()))
    t0 = time.time()
    res: dict = {"variant": name, "config": config.name, "sets": sets[5:], "env": env,
                 "command": " ".join([*(f"{k}={v}" for k, v in env.items()), "python3", *cmd[1:]])}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                                   "PYTHONUNBUFFERED": "1", **env})
        res["rc"] = proc.returncode
        tail = (proc.stdout + proc.stderr)[-3000:]
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
        res["steady"] = steady(history, args.skip)
        res["history"] = history
    if (out_dir / "profile_rank0.json").exists():
        res["profile"] = json.loads((out_dir / "profile_rank0.json").read_text())
    if res["rc"] != 0 or not history:
        res["error_tail"] = "OOM" if "OutOfMemoryError" in tail else tail[-1500:]
    print(json.dumps({k: v for k, v in res.items() if k not in ("history", "losses", "command")}), flush=True)
    return res


def run_parity(args, run_root: Path, opt: Path, budget_end: float) -> dict:
    """Baseline and optimised variants over the same steps, batches and flow noise: their losses.
    Two processes share the GPU at a time (each holds its own full fp32 state: about 55 GB)."""
    from concurrent.futures import ThreadPoolExecutor

    sets = [f"train.micro_batch={args.parity_mbs}"]
    jobs = [("parity_baseline", CONFIGS / "pi05_baseline.toml", sets)]
    jobs += [(f"parity_{n}", opt, [*TUNE[n], *sets]) for n in args.parity]
    saved = (args.steps, args.log_every, args.variant_timeout)
    args.steps, args.log_every, args.variant_timeout = args.parity_steps, 50, max(args.variant_timeout, 400)
    try:
        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(lambda j: run_variant(j[0], j[1], j[2], args, run_root, budget_end), jobs))
    finally:
        args.steps, args.log_every, args.variant_timeout = saved
    out = {"micro_batch": args.parity_mbs, "steps": args.parity_steps, "runs": done}
    base = done[0].get("losses", [])
    for r in done[1:]:
        n = min(len(base), len(r.get("losses", [])))
        if n:
            diffs = [abs(a - b) for a, b in zip(base[:n], r["losses"][:n])]
            r["parity"] = {"steps": n, "mean_abs_diff": sum(diffs) / n, "max_abs_diff": max(diffs),
                           "mean_rel_diff": sum(d / abs(b) for d, b in zip(diffs, base)) / n}
            print(r["variant"], json.dumps(r["parity"]), flush=True)
    return out


def run_probe(variants: list[str], args, budget_end: float) -> list[dict]:
    if not PROBE.exists() or args.cpu:
        return []
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}", str(PROBE), *variants]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, budget_end - time.time()))
        text = proc.stdout
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace")
    out = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    print(json.dumps(out), flush=True)
    return out


def attention_check() -> dict:
    """SDPA at the full LM shapes with and without the key-padding mask the prompt padding needs:
    which backend runs and what it costs (the joint attention is the model's, this is a probe)."""
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        return {}
    b, p, hd = 32, 712, 256
    q = torch.randn(b, 8, p, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, 1, p, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    mask = torch.ones(b, 1, 1, p, dtype=torch.bool, device="cuda")
    mask[:, :, :, 600:] = False
    out = {}
    for name, m, kk, vv in (("no_mask_gqa", None, k, v), ("mask_gqa", mask, k, v),
                            ("mask_expanded_kv", mask, k.expand(b, 8, p, hd), v.expand(b, 8, p, hd))):
        gqa = kk.shape[1] != q.shape[1]
        for _ in range(3):
            F.scaled_dot_product_attention(q, kk, vv, attn_mask=m, enable_gqa=gqa).sum().backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            F.scaled_dot_product_attention(q, kk, vv, attn_mask=m, enable_gqa=gqa).sum().backward()
        torch.cuda.synchronize()
        out[name + "_fwd_bwd_ms"] = round((time.perf_counter() - t0) / 10 * 1e3, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--main", action="store_true", help="baseline, optimised (profiled), the probe, attention check")
    p.add_argument("--optimised", action="store_true", help="the optimised config alone, profiled (first)")
    p.add_argument("--probe", action="store_true", help="the probe's best setting (after the candidates)")
    p.add_argument("--baseline", action="store_true", help="the baseline (after the probe)")
    p.add_argument("--candidates", nargs="*", default=[], help=f"tuning candidates: {', '.join(TUNE)}")
    p.add_argument("--ablate", nargs="*", default=[], help=f"'all' or some of: {', '.join(ABLATION)}")
    p.add_argument("--base-sets", nargs="*", default=[], help="overrides added to optimised for --ablate")
    p.add_argument("--tag", default="gpu", help="result file: $OUT/trainkit_<tag>.json")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10, help="steps left out of steady state (compile, warm-up)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=560, help="stop starting variants after this")
    p.add_argument("--variant-timeout", type=float, default=300)
    p.add_argument("--work", type=Path, default=Path("/tmp/trainkit_bench"))
    p.add_argument("--episodes", type=int, default=8, help="episodes of the generated dataset")
    p.add_argument("--length", type=int, default=80, help="frames per generated episode")
    p.add_argument("--parity", nargs="*", default=[], metavar="VARIANT",
                   help="loss parity: baseline and these TUNE variants of optimised, --parity-steps steps at "
                        "--parity-mbs, two at a time on the GPU (speed is not measured)")
    p.add_argument("--parity-steps", type=int, default=200)
    p.add_argument("--parity-mbs", type=int, default=4)
    p.add_argument("--cpu", action="store_true", help="dry run of the same path: tiny preset on 2 gloo processes")
    args = p.parse_args()
    budget_end = time.time() + args.budget_s
    import torch
    args.nproc = 2 if args.cpu else max(1, torch.cuda.device_count())
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(["python3", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "torch": torch.__version__, "nproc": args.nproc, "variants": []}
    t0 = time.time()
    args.shards = make_shards(args.work / "data", 224, episodes=args.episodes, length=args.length)
    res["shards_s"] = round(time.time() - t0, 1)
    dump = lambda: (args.out / f"trainkit_{args.tag}.json").write_text(json.dumps(res, indent=1) + "\n")  # noqa: E731
    runs, opt = args.work / "runs", CONFIGS / "pi05_optimised.toml"

    def go(name: str, cfg: Path, sets: list[str]) -> dict:
        if time.time() > budget_end - 30:
            r = {"variant": name, "rc": "skipped: out of time budget"}
        else:
            r = run_variant(name, cfg, sets, args, runs, budget_end)
        res["variants"].append(r)
        dump()
        return r

    if args.main:
        go("baseline", CONFIGS / "pi05_baseline.toml", ["output.profile_steps=3"])
        go("optimised", opt, ["output.profile_steps=3"])
        res["probe"] = run_probe(["opt_compile_noac_mbs32"], args, budget_end)
        dump()
        res["attention"] = attention_check()
    if args.optimised:
        go("optimised", opt, ["output.profile_steps=3"])
    base = list(args.base_sets)
    if args.candidates:
        tried = [(go(n, opt, [*base, *TUNE[n], "output.profile_steps=3"]), TUNE[n]) for n in args.candidates]
        ok = [(r["steady"]["samples_per_s_gpu"], sets) for r, sets in tried if r.get("rc") == 0 and "steady" in r]
        if ok:
            base = [*base, *max(ok)[1]]
        res["ablation_base"] = base
    if args.probe:
        res["probe"] = run_probe(["opt_compile_noac_mbs32"], args, budget_end)
        dump()
    if args.baseline:
        go("baseline", CONFIGS / "pi05_baseline.toml", ["output.profile_steps=3"])
    if args.parity:
        res["parity"] = run_parity(args, runs, opt, budget_end)
        dump()
    names = list(ABLATION) if args.ablate == ["all"] else args.ablate
    for n in names:
        go(n, opt, [*base, *ABLATION[n]])
    dump()
    print(f"{'variant':24} {'ms/step':>8} {'samples/s/GPU':>14} {'MFU %':>6} {'peak GiB':>9} {'wait %':>7} {'AG/step':>8}")
    for v in res["variants"]:
        s = v.get("steady")
        if s:
            print(f"{v['variant']:24} {s['step_time_s'] * 1e3:8.0f} {s['samples_per_s_gpu']:14.2f} {100 * s['mfu']:6.1f} "
                  f"{s['peak_mem_gib']:9.1f} {100 * s['data_wait_frac']:7.2f} {s['all_gathers_per_step']:8.0f}")
        else:
            print(f"{v['variant']:24} {v.get('rc')} {v.get('error_tail', '')[-200:]!r}")
    for pr in res.get("probe", []):
        print("probe", json.dumps(pr))
    print("attention", json.dumps(res.get("attention", {})))


if __name__ == "__main__":
    main()

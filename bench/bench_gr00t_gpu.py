"""trainkit's `gr00t` family on one GPU, in one call: the probe (`bench/probes/gr00t_probe.py`, a
verbatim copy of ../shared/probes/) at micro-batch 16 and at its best (128), then the trainer:
`optimised` at micro-batch 16 with CUDA graphs on and off (both profiled), `baseline` at 16,
and `optimised` at larger micro-batches, each as its own `torchrun` over real shards, for each
preset of `--presets`: first `n16-h50` (the probe's shapes: 50 actions), then `n16` (16 actions;
its graphed micro-batch 16 and the sweep only); `--only` picks parts.

    python3 bench/bench_gr00t_gpu.py --out $OUT                    # the GPU call (H200)
    python3 bench/bench_gr00t_gpu.py --out /tmp/x --cpu            # dry run: tiny preset, 2 gloo procs

Shards as bench/bench_trainkit_gpu.py makes them (PNG image columns, no codec on the machine):
2 real cameras at 224x224, which N1.6's rule trains at 252x252 (81 tokens each), resized on the
device. Results are rewritten to `$OUT/trainkit_gr00t.json` after every variant; steady state =
median of the metric intervals after the first `--skip` steps (compilation, graph capture,
profiler window). `<preset>_graphs_vs_eager_max_loss_diff`: the losses of the graphed and the
eager optimised run at micro-batch 16, step by step (same seed, same batches).
Call 1 (2026-12-01 21:07 UTC, bench/results/trainkit_gr00t_call1.json) ran an earlier form of this
script with the `n16` preset alone (the configs' preset): its trainer rows have horizon 16, the
probe's 50.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_trainkit_gpu import make_shards, run_variant  # noqa: E402

CONFIGS = ROOT / "trainkit" / "configs"
PROBE = ROOT / "bench" / "probes" / "gr00t_probe.py"
OPT, BASE = CONFIGS / "gr00t_optimised.toml", CONFIGS / "gr00t_baseline.toml"
PROFILE = "output.profile_steps=3"


def run_probe(variants: list[str], budget_end: float) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", str(PROBE), *variants]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, budget_end - time.time()))
        text, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        text, err = (e.stdout or b"").decode(errors="replace"), "timeout"
    out = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    if not out:
        out = [{"error": err[-1500:]}]
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--skip", type=int, default=9, help="steps left out of steady state")
    p.add_argument("--log-every", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=270, help="stop starting variants after this")
    p.add_argument("--variant-timeout", type=float, default=150)
    p.add_argument("--sweep", nargs="*", type=int, default=[128], help="optimised micro-batches beyond 16")
    p.add_argument("--presets", nargs="*", default=["n16-h50", "n16"],
                   help="model presets; the first (the probe's horizon 50) also gets the probe, baseline and eager runs")
    p.add_argument("--only", nargs="*", default=None, help="run just these: graphs16 probe baseline eager16 sweep")
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--length", type=int, default=80, help="frames per episode")
    p.add_argument("--set", dest="extra", action="append", default=[], help="an override added to every trainer variant")
    p.add_argument("--work", type=Path, default=Path("/tmp/gr00t_bench"))
    p.add_argument("--cpu", action="store_true", help="dry run: tiny preset, 2 gloo processes, no graphs, no probe")
    args = p.parse_args()
    budget_end = time.time() + args.budget_s
    import torch
    args.nproc = 2 if args.cpu else 1
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(["python3", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "torch": torch.__version__, "load_avg_start": os.getloadavg()[0], "variants": []}
    t0 = time.time()
    args.shards = make_shards(args.work / "data", 64 if args.cpu else 224, episodes=4 if args.cpu else args.episodes,
                              length=40 if args.cpu else args.length)
    res["shards_s"] = round(time.time() - t0, 1)
    dump = lambda: (args.out / "trainkit_gr00t.json").write_text(json.dumps(res, indent=1) + "\n")  # noqa: E731
    cpu = ["parallel.cuda_graphs=false"] if args.cpu else []

    def go(name: str, cfg: Path, sets: list[str]) -> dict:
        if time.time() > budget_end - 20:
            r = {"variant": name, "rc": "skipped: out of time budget"}
        else:
            r = run_variant(name, cfg, [*sets, *args.extra, *cpu], args, args.work / "runs", budget_end)
        res["variants"].append(r)
        dump()
        return r

    want = lambda part: args.only is None or part in args.only  # noqa: E731
    for i, preset in enumerate(args.presets):  # the first is the probe's shapes (horizon 50)
        tag, pre = f"{preset}_", [f"model.preset={preset}"]
        graphs = go(f"{tag}optimised_mbs16_graphs", OPT, [*pre, "train.micro_batch=16", PROFILE]) \
            if want("graphs16") else {}
        if i == 0 and not args.cpu and want("probe"):
            res["probe"] = run_probe(["compile_mbs16", "compile_mbs128"], budget_end)
            dump()
        if i == 0 and want("baseline"):
            go(f"{tag}baseline_mbs16", BASE, [*pre, "train.micro_batch=16"])
        eager = {}
        if i == 0 and want("eager16"):
            eager = go(f"{tag}optimised_mbs16_no_graphs", OPT,
                       [*pre, "train.micro_batch=16", "parallel.cuda_graphs=false", PROFILE])
        if graphs.get("losses") and eager.get("losses"):
            res[f"{tag}graphs_vs_eager_max_loss_diff"] = max(abs(a - b) for a, b in zip(graphs["losses"], eager["losses"]))
        graphs_ok = graphs.get("rc") == 0 and "steady" in graphs
        for mbs in args.sweep if want("sweep") else []:  # without graphs where the graphed run failed
            go(f"{tag}optimised_mbs{mbs}_{'graphs' if graphs_ok else 'no_graphs'}", OPT,
               [*pre, f"train.micro_batch={mbs}", *([] if graphs_ok else ["parallel.cuda_graphs=false"])])
    res["load_avg_end"] = os.getloadavg()[0]
    dump()
    print(f"{'variant':28} {'ms/step':>8} {'samples/s/GPU':>14} {'MFU %':>6} {'peak GiB':>9} {'wait %':>7}")
    for v in res["variants"]:
        s = v.get("steady")
        if s:
            mfu = f"{100 * s['mfu']:6.1f}" if s.get("mfu") is not None else "   n/a"
            print(f"{v['variant']:28} {s['step_time_s'] * 1e3:8.0f} {s['samples_per_s_gpu']:14.2f} {mfu} "
                  f"{s['peak_mem_gib'] or 0:9.1f} {100 * s['data_wait_frac']:7.2f}")
        else:
            print(f"{v['variant']:28} {v.get('rc')} {v.get('error_tail', '')[-300:]!r}")
    for pr in res.get("probe", []):
        print("probe", json.dumps(pr))
    print({k: v for k, v in res.items() if k.endswith("graphs_vs_eager_max_loss_diff")})


if __name__ == "__main__":
    main()

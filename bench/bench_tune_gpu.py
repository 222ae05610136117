"""`trainkit tune` on the GPU machine, from real shards through the loader, in one command.

    python3 bench/bench_tune_gpu.py --out $OUT --memory-cap 80 --budget-min 8   # pi05_optimised, 1 GPU
    python3 bench/bench_tune_gpu.py --out /tmp/x --cpu                           # dry run: tiny preset, CPU

Shards are bench_trainkit_gpu.py's (generated PNG-column dataset, converted by datakit: 2 cameras
at 224x224 mapped to Pi0.5's 3 slots, the third unfilled), so the runs match
bench/results/trainkit.md's. Writes $OUT/tune/ (tune.json, best.toml, one folder per run) and
$OUT/tune_bench.json (the command, machine, the shard build's time).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", default="trainkit/configs/pi05_optimised.toml")
    p.add_argument("--memory-cap", type=float, default=80.0)
    p.add_argument("--budget-min", type=float, default=8.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/trainkit_bench"))
    p.add_argument("--cpu", action="store_true", help="dry run: pi05_tiny, small shards, compile off, 0.5 min")
    args, extra = p.parse_known_args()  # anything else goes to `trainkit tune` as it is
    import torch

    from bench_trainkit_gpu import make_shards

    t0 = time.time()
    shards = make_shards(args.work / ("data_cpu" if args.cpu else "data"), 64 if args.cpu else 224,
                         episodes=8, length=80)
    built = round(time.time() - t0, 1)
    tune = [sys.executable, "-m", "trainkit.cli", "tune", args.config, "--memory-cap", str(args.memory_cap),
            "--budget-min", str(args.budget_min), "--out", str(args.out / "tune"), "--set", f"data.shards={shards}"]
    if args.cpu:
        tune = [sys.executable, "-m", "trainkit.cli", "tune", "trainkit/configs/pi05_tiny.toml", "--memory-cap", "1",
                "--budget-min", "0.5", "--out", str(args.out / "tune"), "--set", f"data.shards={shards}",
                "--set", "data.num_workers=0", "--compile", "off", "--micro-batches", "2,4", "--steps", "4"]
    tune += extra
    args.out.mkdir(parents=True, exist_ok=True)
    rc = subprocess.call(tune, cwd=ROOT)
    (args.out / "tune_bench.json").write_text(json.dumps({
        "command": " ".join(["python3", *sys.argv]), "tune": " ".join(tune[1:]), "rc": rc,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "shards_s": built},
        indent=1) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""`trainkit ladder` on the GPU machine: the Pi0.5 `full` ladder from generated shards, outputs into --out.

    python3 bench/bench_ladder_gpu.py --out $OUT                        # pi05_baseline.toml, every rung
    python3 bench/bench_ladder_gpu.py --out $OUT --rungs compile,fp8 --steps 10 --warmup 10
    python3 bench/bench_ladder_gpu.py --out /tmp/x --cpu                 # dry run: tiny preset, CPU, few steps

The machine has no video decoder, so the shards are bench_trainkit_gpu.py's (PNG image columns
converted by datakit: 2 real cameras at 224x224 mapped to Pi0.5's 3 slots, the third unfilled).
The ladder itself is the command users run (`python -m trainkit.cli ladder ...`), one process per
rung on all local GPUs (`--nproc`); this script only makes the data, picks the shapes and copies
ladder.md / ladder.json / the PNGs to --out (bench/results/ladder_pi05.md is made from them).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# the tiny preset at the CPU-capable switches, for a dry run of the same path
CPU_SETS = ("model.preset=tiny", "parallel.param_dtype=float32", "train.micro_batch=4", "data.num_workers=0")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", type=Path, default=ROOT / "trainkit" / "configs" / "pi05_baseline.toml")
    p.add_argument("--rungs", default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rung-timeout", type=float, default=420.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_ladder"))
    p.add_argument("--cpu", action="store_true", help="dry run: tiny preset on the CPU, 3 + 2 steps")
    args = p.parse_args()

    from bench_trainkit_gpu import make_shards

    import torch
    nproc = 1 if args.cpu else max(1, torch.cuda.device_count())
    shards = make_shards(args.work / "data", 64 if args.cpu else 224, episodes=4 if args.cpu else 8,
                         length=40 if args.cpu else 80)
    ladder_out = args.work / "ladder"
    shutil.rmtree(ladder_out, ignore_errors=True)
    sets = [f"data.shards={shards}", *(CPU_SETS if args.cpu else ())]
    cmd = [sys.executable, "-m", "trainkit.cli", "ladder", str(args.config), *[a for s in sets for a in ("--set", s)],
           "--out", str(ladder_out), "--nproc", str(nproc), "--rung-timeout", str(args.rung_timeout),
           "--steps", str(2 if args.cpu else args.steps), "--warmup", str(3 if args.cpu else args.warmup)]
    if args.cpu:
        cmd += ["--profile-steps", "0", "--rungs", args.rungs or "slot_pruning,uint8_h2d,block_fsdp,fp8"]
    elif args.rungs:
        cmd += ["--rungs", args.rungs]
    t0 = time.time()
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("ladder.md", "ladder.json", "ladder_waterfall.png", "ladder_losses.png"):
        if (ladder_out / name).exists():
            shutil.copy(ladder_out / name, args.out / name)
    for log in sorted((ladder_out / "rungs").glob("*/trial.log")):  # each rung's tail, for a failed one's cause
        (args.out / f"{log.parent.name}.log").write_text("\n".join(log.read_text(errors="replace").splitlines()[-60:]))
    print(f"bench_ladder_gpu: rc {rc}, {time.time() - t0:.0f} s, outputs in {args.out}", flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()

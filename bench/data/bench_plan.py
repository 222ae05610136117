"""`datakit plan` against the loader benchmark on the same shards: the samples/s the plan predicts
(its ceiling, `datakit plan --measure`) against `for batch in ShardLoader(...)` timed apart, and
the bytes per sample the plan counts against the bytes the loader's batches carry.

    .venv/bin/python bench/data/bench_plan.py                 # table + JSON; writes /tmp/bench_plan/plan.json
    .venv/bin/python bench/data/bench_plan.py --record        # also bench/results/plan.json

The shards: a `datakit.synth` LeRobot v3.0 dataset at native 480x640, 3 cameras, one of them
black (the shape of issue 13), converted by `datakit.convert`. Both sides use the Pi0.5 sample
(current frame of every camera, 50 actions), batch 32, the same workers. Rounds interleave the
two (plan first in even rounds, the loader first in odd ones) and the medians are compared, so
load from elsewhere on the machine, and the page-cache churn of the plan's cold read, fall on
both; each run records its load averages. The plan runs as a user types it, in its own process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from datakit.loader import LoaderConfig, ShardLoader  # noqa: E402
from datakit.machine import available_cpus  # noqa: E402
from datakit.shards.index import OFFSET_PREFIX, column, load_frames, load_index  # noqa: E402

CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
# Pi0.5-shaped samples: the fields trainkit's pi05 loader preset sets (trainkit/models/pi05/batches.py)
PI05_SHAPE = {"frame_offsets": (0,), "action_horizon": 50, "norm": "quantile"}


def build(work: Path, episodes: int, length: int, height: int, width: int) -> Path:
    """The converted folder (built once, reused while its index exists)."""
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    src, out = work / "src", work / "out"
    if not (out / "index.json").exists():
        make_lerobot_dataset(src, version="v3.0", episode_lengths=(length,) * episodes, height=height, width=width,
                             cameras=CAMS, blank_cameras=(CAMS[2],))
        convert(src, out, ConvertConfig(workers=available_cpus(), progress=False, shard_size=256 << 20), force=True)
    return out


def every_camera_bytes(out: Path) -> float:
    """Bytes per sample when every slot camera counts (the plan's old rule): one frame of each
    camera that has one at the anchor, averaged over the anchors."""
    index, frames = load_index(out), load_frames(out)
    total = sum(index.cameras[c].frame_bytes * (column(frames, OFFSET_PREFIX + c) >= 0) for c in index.cameras)
    return float(total.mean())


def plan(out: Path, workers: int, seconds: float) -> dict:
    shape = out.parent / "pi05-loader.toml"  # --loader-config: PI05_SHAPE
    shape.write_text('[loader]\nframe_offsets = [0]\naction_horizon = 50\nnorm = "quantile"\n')
    cmd = [sys.executable, "-c", "import sys; from datakit.cli import main; sys.exit(main())", "plan", str(out),
           "--samples-per-s", "1000", "--loader-config", str(shape), "--batch-size", "32", "--workers", str(workers),
           "--measure", "--measure-seconds", str(seconds), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(p.stdout)


def loader(out: Path, workers: int, seconds: float, warmup: int = 3) -> dict:
    """`for batch in ShardLoader(...)`, timed for `seconds` after `warmup` batches, across epochs."""
    ld = ShardLoader(out, LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=workers))
    n = items = img = 0
    t0 = time.perf_counter()
    done = False
    while not done:
        for batch in ld:
            n += 1
            if n <= warmup:
                t0 = time.perf_counter()
                continue
            items += batch["row"].numel()
            img += batch["images"].nbytes
            if time.perf_counter() - t0 >= seconds:
                done = True
                break
    dt = time.perf_counter() - t0
    ld.close()
    return {"items_per_s": items / dt, "image_bytes_per_item": img / items, "seconds": dt, "items": items}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_plan"))
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--length", type=int, default=80)
    p.add_argument("--size", default="480x640", help="HxW of the cameras")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=5.0, help="seconds each side is timed per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", type=Path, help="JSON result (default: WORK/plan.json)")
    p.add_argument("--record", action="store_true", help="also write bench/results/plan.json")
    args = p.parse_args()
    h, w = (int(x) for x in args.size.lower().split("x"))
    out = build(args.work, args.episodes, args.length, h, w)
    load_start = _loadavg()
    rounds = []
    for i in range(args.rounds):  # odd rounds time the loader first: neither side always follows the other
        if i % 2:
            timed = loader(out, args.workers, args.seconds)
            doc = plan(out, args.workers, args.seconds)
        else:
            doc = plan(out, args.workers, args.seconds)
            timed = loader(out, args.workers, args.seconds)
        rounds.append({"plan": doc, "loader": timed, "loader_first": bool(i % 2)})
    predicted = statistics.median(r["plan"]["ceiling"]["samples_per_s"] for r in rounds)
    measured = statistics.median(r["loader"]["items_per_s"] for r in rounds)
    first = rounds[0]["plan"]
    res = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M"),
        "cores": available_cpus(), "loadavg_start": load_start, "loadavg_end": _loadavg(),
        "dataset": {k: load_index(out).info()[k] for k in ("num_episodes", "num_frames", "bytes")},
        "size": args.size, "workers": args.workers, "seconds": args.seconds,
        "bytes_per_sample": {"every_camera": every_camera_bytes(out),
                             "plan": first["plan"]["image_bytes_per_sample"],
                             "loader_batches": rounds[0]["loader"]["image_bytes_per_item"]},
        "rounds": [{"ceiling": r["plan"]["ceiling"], "plan_loader": r["plan"]["loader"],
                    "page_cache_bytes_per_s": r["plan"]["measured"]["page_cache_bytes_per_s"],
                    "disk_bytes_per_s": r["plan"]["measured"]["disk_bytes_per_s"], "loader": r["loader"],
                    "loader_first": r["loader_first"]}
                   for r in rounds],
        "predicted_samples_per_s": predicted, "loader_samples_per_s": measured, "ratio": predicted / measured,
    }
    target = args.out or args.work / "plan.json"
    for path in [target] + ([ROOT / "bench" / "results" / "plan.json"] if args.record else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1) + "\n")
    _table(res)
    print(json.dumps(res, indent=1))


def _table(res: dict) -> None:
    b = res["bytes_per_sample"]
    mib = 2 ** 20
    print(f"bytes per sample: every camera {b['every_camera'] / mib:.2f} MiB | plan {b['plan'] / mib:.2f} MiB | "
          f"loader's batches {b['loader_batches'] / mib:.2f} MiB")
    print("| round | first | page-cache ceiling | disk ceiling | loader ceiling (plan) | ceiling (bound) | "
          "loader timed apart |")
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(res["rounds"], 1):
        c = r["ceiling"]
        print(f"| {i} | {'loader' if r['loader_first'] else 'plan'} | {c['page_cache_samples_per_s']:,.0f} | "
              f"{c['disk_samples_per_s']:,.0f} | "
              f"{c['loader_samples_per_s']:,.0f} | {c['samples_per_s']:,.0f} ({c['bound']}) | "
              f"{r['loader']['items_per_s']:,.0f} |")
    print(f"median: predicted {res['predicted_samples_per_s']:,.0f} samples/s, "
          f"loader {res['loader_samples_per_s']:,.0f} samples/s, ratio {res['ratio']:.3f}; "
          f"load {res['loadavg_start']} -> {res['loadavg_end']}")


def _loadavg() -> list[float]:
    return [float(x) for x in open("/proc/loadavg").read().split()[:3]]


if __name__ == "__main__":
    main()

"""LeRobot's own training step on LeRobotDataset (video decoded in workers) vs datakit's ShardLeRobotDataset.

    # the CPU machine: a fixed stand-in model step (a sleep in place of lerobot-train's update_policy)
    /tmp/lerobot-venv/bin/python bench/peers/bench_lerobot_train.py --stand-in-ms 100 --policies act \\
        --workers 2 --batch-size 8 --out bench/results/lerobot_train_cpu_2026-12-07.json
    # a GPU: the real ACT and diffusion steps at LeRobot's default batch (8) and widths
    python bench/peers/bench_lerobot_train.py --device cuda --policies act diffusion --workers 8 --out $OUT/lt.json

Needs lerobot 0.6.1 (+ accelerate) importable; video decoding uses LeRobot's `pyav` backend, so
PyAV's wheel is all the FFmpeg it needs. It writes a synthetic LeRobot v3.0 dataset (AV1 as
LeRobot records: libsvtav1, g=2, crf=30; a textured, moving scene for a realistic bitrate),
converts it with datakit, then for each policy runs `lerobot_train.main()` in a fresh process twice:
stock (`--dataset.root=SRC --dataset.video_backend=pyav`) and through `datakit.lerobot.train`
(`--dataset.root=OUT`), with the same flags, workers and batch. Both runs return uint8 frames
(lerobot-train's `return_uint8=True`) and normalise in LeRobot's preprocessor.

Timing: `update_policy` is wrapped to note when each step's update starts and ends; the time
from one update's end to the next one's start is exactly what lerobot-train counts as
`dataloading_s` (next batch, uint8 -> float, preprocessor), the rest is the update (the real
policy step, or with --stand-in-ms a sleep of that length). lerobot-train's `cycle` is wrapped
too: the time in next(dataloader) alone is the loader's wait. After --warmup steps: samples/s =
batch / mean step time; data share = mean data wait / mean step time (lerobot-train's data_s);
loader share = mean loader wait / mean step time. Each dataset runs --repeats
times, interleaved; the speedup is the ratio of the median samples/s. Output: one JSON object
(arguments, machine, per policy and dataset each run's numbers), rewritten after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAMERAS = ("observation.images.top", "observation.images.wrist")


def make_data(work: Path, episodes: int, length: int, height: int, width: int, fps: int) -> tuple[Path, Path]:
    """(LeRobot v3.0 source, datakit shard folder) under `work`, made once."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    src, out = work / "src", work / "out"
    if not (out / "checksums.json").exists():
        make_lerobot_dataset(src, version="v3.0", episode_lengths=(length,) * episodes, height=height, width=width,
                             fps=fps, cameras=CAMERAS, blank_cameras=(), detail=1.0)
        convert(src, out, ConvertConfig(workers=max(1, (os.cpu_count() or 2) // 2), progress=False))
        # the source's stats.json as LeRobot records it (images included; the synthetic one has state
        # and action only): LeRobot's statistics of the same frames, so both runs normalise alike
        from datakit.lerobot import ShardLeRobotDataset

        stats = ShardLeRobotDataset(out).meta.stats
        (src / "meta" / "stats.json").write_text(json.dumps(
            {k: {s: v.tolist() for s, v in st.items()} for k, st in stats.items()}))
    return src, out


def child(args: argparse.Namespace) -> None:
    """One lerobot-train run (args.child: "lerobot" or "shards"); the step times go to args.json."""
    import torch

    from bench.peers.peer_report import stub_opencv

    stubbed = stub_opencv()
    from lerobot.scripts import lerobot_train

    if stubbed:  # only the import needed it: later find_spec("cv2") calls (transformers) see OpenCV absent
        del sys.modules["cv2"]
    marks: list[tuple[float, float]] = []
    real = lerobot_train.update_policy

    def timed(train_metrics, policy, batch, optimizer, grad_clip_norm, accelerator=None, **kw):
        start = time.perf_counter()
        if args.stand_in_ms:
            time.sleep(args.stand_in_ms / 1000)
            train_metrics.loss, train_metrics.grad_norm, train_metrics.lr = 0.0, 0.0, 0.0
            train_metrics.update_s = time.perf_counter() - start
            out = (train_metrics, {})
        else:
            out = real(train_metrics, policy, batch, optimizer, grad_clip_norm, accelerator=accelerator, **kw)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        marks.append((start, time.perf_counter()))
        return out

    lerobot_train.update_policy = timed
    fetches: list[float] = []  # time in next(dataloader) alone, the loader's share of the data wait
    cycle = lerobot_train.cycle

    def timed_cycle(iterable):
        it = cycle(iterable)
        while True:
            t = time.perf_counter()
            batch = next(it)
            fetches.append(time.perf_counter() - t)
            yield batch

    lerobot_train.cycle = timed_cycle
    flags = [f"--policy.type={args.policy}", f"--policy.device={args.device}", f"--batch_size={args.batch_size}",
             f"--num_workers={args.workers}", f"--steps={args.steps}", "--policy.push_to_hub=false",
             f"--output_dir={args.run_dir}", "--save_checkpoint=false", "--log_freq=0", "--wandb.enable=false",
             "--policy.pretrained_backbone_weights=null"]  # no download; weights do not change the timing
    if args.child == "shards":
        from datakit.lerobot.train import use_shards

        use_shards()
        flags += [f"--dataset.root={args.shards}", "--dataset.repo_id=bench/shards"]
    else:
        flags += [f"--dataset.root={args.source}", "--dataset.repo_id=bench/source", "--dataset.video_backend=pyav"]
    sys.argv = [sys.argv[0], *flags]
    lerobot_train.main()
    steps = marks[args.warmup:]
    step = [b[0] - a[0] for a, b in zip(steps, steps[1:])]
    wait = [b[0] - a[1] for a, b in zip(steps, steps[1:])]
    mean_step, mean_wait = sum(step) / len(step), sum(wait) / len(wait)
    fetch = fetches[args.warmup + 1 : args.warmup + 1 + len(step)]
    mean_fetch = sum(fetch) / len(fetch)
    Path(args.json).write_text(json.dumps({
        "samples_per_s": args.batch_size / mean_step, "data_share": mean_wait / mean_step,
        "loader_share": mean_fetch / mean_step, "loader_wait_s": mean_fetch,
        "step_s": mean_step, "data_wait_s": mean_wait, "update_s": mean_step - mean_wait, "steps_timed": len(step)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--policies", nargs="+", default=["act"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--stand-in-ms", type=float, default=0.0, help="a fixed sleep in place of the model step (0: real)")
    p.add_argument("--batch-size", type=int, default=8, help="lerobot-train's default is 8")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers, the same for both")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2, help="runs of each dataset, interleaved (a shared machine drifts)")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--length", type=int, default=150, help="frames per episode")
    p.add_argument("--size", type=int, nargs=2, default=(240, 320), help="camera height width")
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--work", default=None, help="where the datasets live (default: a temporary folder)")
    # internal: one run
    p.add_argument("--child", choices=("lerobot", "shards"), default=None)
    p.add_argument("--policy", default="act")
    p.add_argument("--source"), p.add_argument("--shards"), p.add_argument("--run-dir"), p.add_argument("--json")
    args = p.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(ROOT))
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_lerobot_train_"))
    t0 = time.perf_counter()
    src, out = make_data(work, args.episodes, args.length, *args.size, args.fps)
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "args": vars(args),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()},
              "data_s": time.perf_counter() - t0, "runs": {}}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    for policy in args.policies:
        for rep, mode in [(r, m) for r in range(args.repeats) for m in ("lerobot", "shards")]:  # interleaved
            js = work / f"{policy}_{mode}.json"
            cmd = [sys.executable, __file__, "--child", mode, "--policy", policy, "--device", args.device,
                   "--stand-in-ms", str(args.stand_in_ms), "--batch-size", str(args.batch_size),
                   "--workers", str(args.workers), "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--source", str(src), "--shards", str(out), "--run-dir", str(work / f"run_{policy}_{mode}"),
                   "--json", str(js), "--out", str(js)]
            subprocess.run(["rm", "-rf", str(work / f"run_{policy}_{mode}")], check=True)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            run = json.loads(js.read_text()) if r.returncode == 0 else {"error": r.stderr[-2000:]}
            run["load_after"] = os.getloadavg()[0]
            result["runs"].setdefault(f"{policy}/{mode}", []).append(run)
            print(policy, mode, rep, json.dumps(run)[:300], flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
        med = {m: _median([r["samples_per_s"] for r in result["runs"][f"{policy}/{m}"] if "samples_per_s" in r])
               for m in ("lerobot", "shards")}
        if all(med.values()):
            result["runs"][f"{policy}/median_samples_per_s"] = med
            result["runs"][f"{policy}/speedup"] = med["shards"] / med["lerobot"]
    result["machine"]["load_after"] = os.getloadavg()
    if torch_cuda := _cuda_name():
        result["machine"]["gpu"] = torch_cuda
    Path(args.out).write_text(json.dumps(result, indent=1))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _cuda_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


if __name__ == "__main__":
    main()

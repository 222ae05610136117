"""Ray engine against the local engine, and the one-shard plan before/after the below-shard split.

    python bench/data/bench_convert_ray.py [--episodes 10] [--frames 60] [--repeats 3] [--out bench/results]

Same input (a LeRobot v2.1 dataset, 3 cameras 480x640 AV1, as bench_convert.py makes), same
options, same number of worker processes (--workers, default 2) for both engines. Sections
(the configs of a section run interleaved, so load from other jobs hits them alike):
- A, many shards (one episode per shard): `--engine local` (process pool) vs `--engine ray`
  (one task per shard) in one Ray session started once (its start-up is reported on its own).
  Ray's overhead per shard = (ray seconds - local seconds) / shards.
- B, a one-shard plan (before Ray starts): --workers 1 vs --workers N with the below-shard
  split (episodes into part files in parallel, joined in order) and without it ("before": the
  split switched off in this process), at native size and at 224x224.
- D, many tiny shards (3 frames each): what a shard costs each engine beyond its work.
- C, the one-shard plan: the local split vs `--engine ray` (one task per episode + a join task).
Each figure is the median of --repeats runs after one warm-up run (its time is reported as
"first run": for Ray it includes starting the session's worker processes). Outputs are checked
byte-identical across every run of a section.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import datakit.convert.engines.local as local_engine  # noqa: E402
from datakit.convert.config import ConvertConfig  # noqa: E402
from datakit.convert import convert  # noqa: E402
from datakit.machine import available_cpus  # noqa: E402
from datakit.synth import make_lerobot_dataset  # noqa: E402


def digest(out: Path) -> dict[str, int]:
    """Every output file's name and size plus the index checksums (which hash the shard hashes)."""
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    files["checksums.json"] = hash((out / "checksums.json").read_bytes())
    return files


def timed(src: Path, work: Path, cfg: ConvertConfig, split: bool = True) -> tuple[float, dict, int]:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    real = local_engine.split_below_shard
    if not split:
        local_engine.split_below_shard = lambda workers, jobs: False  # the local engine as it was before
    try:
        t0 = time.perf_counter()
        s = convert(src, out, cfg)
        dt = time.perf_counter() - t0
    finally:
        local_engine.split_below_shard = real
    d = digest(out)
    shutil.rmtree(out)
    return dt, d, s.index.num_shards


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the local pool's workers); Ray's
    workers are the raylet's children, so Ray rows report n/a."""
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def section(name: str, configs: dict[str, tuple], src: Path, work: Path, repeats: int, rows: list[dict],
            frames: int) -> dict:
    """Each config once to warm up (imports, decoders, Ray workers, page cache), then `repeats`
    rounds of all configs interleaved, so load from other jobs hits them alike; the outputs of
    every run of the section must be identical. Returns label -> median seconds."""
    first = {label: timed(src, work, cfg, split)[0] for label, (cfg, split) in configs.items()}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in configs}
    ref = None
    for _ in range(repeats):
        for label, (cfg, split) in configs.items():
            c0 = cpu_seconds()
            dt, d, shards = timed(src, work, cfg, split)
            runs[label].append((dt, (cpu_seconds() - c0) / dt))
            ref = ref or d
            assert d == ref, f"{name} {label}: output differs from the section's first run"
    med = {}
    for label, rs in runs.items():
        med[label] = statistics.median(r[0] for r in rs)
        cpu = None if configs[label][0].engine == "ray" else statistics.median(r[1] for r in rs)
        rows.append({"what": f"{name}: {label}", "seconds": med[label], "runs": [r[0] for r in rs],
                     "first_run": first[label], "frames": frames,
                     "cpu_per_wall": cpu, "shards": shards})
        print(f"{name}: {label}: median {med[label]:.2f} s  runs {[round(r[0], 2) for r in rs]}", flush=True)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--frames", type=int, default=60, help="frames per episode")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny-shards", type=int, default=40, help="shards of section D")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    import ray

    work = Path(tempfile.mkdtemp(prefix="bench-convert-ray-"))
    load0 = os.getloadavg()[0]
    try:
        src = work / "src"
        make_lerobot_dataset(src, version="v2.1", codec="av1", height=480, width=640, fps=15,
                             episode_lengths=[args.frames] * args.episodes, detail=1.0)
        frames = args.episodes * args.frames
        rows: list[dict] = []
        w, n = args.workers, args.repeats
        many = dict(progress=False, shard_size=1)  # one episode per shard
        one = dict(progress=False, shard_size=1 << 40)  # every episode in one shard
        b = {}
        for size in (None, "224x224"):  # B before Ray starts: the local pool forks this process
            b[size] = section(f"B 1 shard, {size or 'native'}", {
                "local --workers 1": (ConvertConfig(workers=1, resize=size, **one), True),
                f"local --workers {w}, before the split (one writer)": (ConvertConfig(workers=w, resize=size, **one), False),
                f"local --workers {w}, below-shard split": (ConvertConfig(workers=w, resize=size, **one), True),
            }, src, work, n, rows, frames)
        t0 = time.perf_counter()
        ray.init(num_cpus=w, include_dashboard=False, logging_level="WARNING")
        ray_start = time.perf_counter() - t0
        a = section(f"A {args.episodes} shards, native", {
            f"local --workers {w}": (ConvertConfig(workers=w, **many), True),
            f"ray --workers {w}": (ConvertConfig(workers=w, engine="ray", **many), True),
        }, src, work, n, rows, frames)
        # D: shards so small that what each engine spends per shard is what is timed; the slope
        # between a few and many of them separates that from the per-run fixed cost
        d = {}
        for count in (args.tiny_shards // 4, args.tiny_shards):
            tiny = work / f"tiny{count}"
            make_lerobot_dataset(tiny, version="v2.1", codec="h264", height=64, width=96, episode_lengths=[3] * count)
            d[count] = section(f"D {count} tiny shards (3 frames of 64x96 each)", {
                f"local --workers {w}": (ConvertConfig(workers=w, **many), True),
                f"ray --workers {w}": (ConvertConfig(workers=w, engine="ray", **many), True),
            }, tiny, work, n, rows, 3 * count)
        c = section("C 1 shard, native", {
            f"local --workers {w}, below-shard split": (ConvertConfig(workers=w, **one), True),
            f"ray --workers {w}, episode tasks + join": (ConvertConfig(workers=w, engine="ray", **one), True),
        }, src, work, n, rows, frames)
        ray.shutdown()
        loc, ray_s = a[f"local --workers {w}"], a[f"ray --workers {w}"]
        ratios = {
            "A ray / local (seconds)": ray_s / loc,
            "A ray overhead per shard (s)": (ray_s - loc) / args.episodes,
            "C ray / local, one shard below the shard (seconds)":
                c[f"ray --workers {w}, episode tasks + join"] / c[f"local --workers {w}, below-shard split"],
        }
        few, lots = args.tiny_shards // 4, args.tiny_shards
        for engine in ("local", "ray"):
            label = f"{engine} --workers {w}"
            ratios[f"D {engine}: seconds per extra tiny shard (slope {few} -> {lots} shards)"] = \
                (d[lots][label] - d[few][label]) / (lots - few)
            ratios[f"D {engine}: fixed seconds per run (intercept)"] = \
                d[few][label] - few * (d[lots][label] - d[few][label]) / (lots - few)
        for size, m in b.items():
            w1 = m["local --workers 1"]
            ratios[f"B {size or 'native'}: workers {w} / workers 1, before the split (seconds)"] = \
                m[f"local --workers {w}, before the split (one writer)"] / w1
            ratios[f"B {size or 'native'}: workers {w} / workers 1, with the split (seconds)"] = \
                m[f"local --workers {w}, below-shard split"] / w1
        result = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join(sys.argv),
            "machine": f"{platform.node()} {platform.machine()} {available_cpus()} cores, "
                       f"{platform.python_version()}, ray {ray.__version__}",
            "dataset": f"LeRobot v2.1, {args.episodes} episodes x {args.frames} frames ({frames} frames), "
                       "3 cameras 480x640 AV1, native size output",
            "ray_init_seconds": ray_start, "load_average_start": load0, "load_average_end": os.getloadavg()[0],
            "repeats": args.repeats, "rows": rows, "ratios": ratios,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "convert_ray.json").write_text(json.dumps(result, indent=1))
        md = ["# Conversion: Ray engine vs local engine; one-shard plan below the shard\n",
              f"- date: {result['date']}", f"- command: `{result['command']}`", f"- machine: {result['machine']}",
              f"- dataset: {result['dataset']}",
              f"- median of {args.repeats} runs after a warm-up run; outputs checked identical within each section; "
              f"load average {load0:.1f} at start, {result['load_average_end']:.1f} at end (other jobs share the 2 cores: noisy)",
              f"- Ray session start (ray.init, local, {w} CPUs), once, not in the figures: {ray_start:.1f} s\n",
              "| run | median s | runs (s) | first run s | frames/s | CPU s / wall s |", "|---|---:|---|---:|---:|---:|"]
        md += [f"| {r['what']} | {r['seconds']:.2f} | {', '.join(f'{x:.2f}' for x in r['runs'])} | {r['first_run']:.2f} | "
               f"{r['frames'] / r['seconds']:.0f} | {'n/a' if r['cpu_per_wall'] is None else format(r['cpu_per_wall'], '.2f')} |"
               for r in rows]
        md += ["", "| ratio | value |", "|---|---:|"] + [f"| {k} | {v:.3f} |" for k, v in ratios.items()] + [""]
        (args.out / "convert_ray.md").write_text("\n".join(md))
        print("\n".join(md))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

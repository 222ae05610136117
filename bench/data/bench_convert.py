"""Conversion benchmark: `datakit convert SRC OUT` as a user types it, against every decoder and
worker count, and against one-thread pure decode of the same files, all measured in one run.

    python bench/data/bench_convert.py [--episodes 12] [--frames 60] [--repeats 3] [--src DIR] [--out DIR | --record]
    python bench/data/bench_convert.py --codec h264 --cameras 2 --blank-cameras 0 --episodes 8 --frames 50 --no-baselines

The dataset is a 480x640 LeRobot v2.1 dataset (AV1 with LeRobot's encoder settings by default, or
H.264 / HEVC; 3 cameras, one black, by default), converted at native size and at 224x224. Every conversion is a fresh `datakit convert`
process (imports, decoder libraries and worker start-up included, as the user pays them), the
runs of all settings interleaved round after round (warm-up round first, not counted), so that
a slow spell of a shared machine hits every setting alike; medians are reported.

Goals (issues 13 and 27): the default command within 10% of the fastest setting measured, at both
sizes, for AV1, H.264 and HEVC, few and many episodes; `--workers 1` >= 0.85x of one-thread pure
decode (`--no-baselines` leaves that comparison out). Seconds are reported as the median and the
minimum of the rounds (a shared machine slows some rounds, never speeds one up).

Writes convert.json and convert.md into a fresh folder (printed), or --out DIR; only --record
writes them into bench/results/ (the record the README cites).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from datakit.convert.config import ConvertConfig  # noqa: E402
from datakit.convert import convert  # noqa: E402
from datakit.decoders import open_decoder  # noqa: E402
from datakit.machine import available_cpus  # noqa: E402
from datakit.sources import scan  # noqa: E402
from datakit.synth import make_lerobot_dataset  # noqa: E402

RECORD = ROOT / "bench" / "results"
DECODERS = ("pyav", "torchcodec", "decord")
SIZES = {"native": [], "224x224": ["--resize", "224x224"]}
ENCODER = {"av1": "libsvtav1 crf=30 g=2", "h264": "libx264 crf=23 veryfast", "hevc": "libx265 crf=28 veryfast"}


def children_cpu() -> float:
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime


def pure_decode(src: Path, backend: str) -> tuple[float, float, int]:
    """Seconds, CPU seconds and camera-frames to decode every video once, in order, 1 thread."""
    spec = scan(src)
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for ref in spec.episodes:
        for vs in ref.videos.values():
            dec = open_decoder(vs.path, backend, threads=1)
            for frame in dec.iter_frames(0, ref.length):
                n += 1
            dec.close()
    return time.perf_counter() - t0, time.process_time() - c0, n


def convert_here(src: Path, out: Path, size: str) -> tuple[float, float]:
    """`--workers 1` with the defaults otherwise, in this process (no start-up: a rate to compare
    with pure decode): wall and CPU seconds."""
    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    convert(src, out, ConvertConfig(workers=1, progress=False, resize=None if size == "native" else size))
    return time.perf_counter() - t0, time.process_time() - c0


def run_convert(src: Path, out: Path, args: list[str]) -> tuple[float, float, dict]:
    """One `datakit convert` process: wall seconds, CPU seconds (all its processes), its --json summary."""
    shutil.rmtree(out, ignore_errors=True)
    summary = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "datakit.cli", "convert", str(src), str(out), "--no-progress", "--json",
           str(summary), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    c0, t0 = children_cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    return dt, children_cpu() - c0, json.loads(summary.read_text())


def settings(decoders: list[str], workers: list[int]) -> list[tuple[str, str, list[str]]]:
    """(size, label, extra flags): the default command, then every decoder x worker count."""
    out = []
    for size, flags in SIZES.items():
        out.append((size, "default", flags))
        for dec in decoders:
            for w in workers:
                out.append((size, f"--decoder {dec} --workers {w}", [*flags, "--decoder", dec, "--workers", str(w)]))
    return out


def compare(paths: list[Path]) -> str:
    """One table of several runs' convert.json: per dataset and size, the default against the
    fastest other setting (wall seconds, medians and minima of the rounds), and the CPU seconds
    of the default against the least any other setting used (the figure a loaded machine blurs
    least)."""
    lines = ["| codec | episodes x frames | size | default: median / min s | fastest option | its median / min s "
             "| fastest / default (median) | (min) | default CPU s | least-CPU option, CPU s | default chose |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---|---|"]
    for p in paths:
        res = json.loads(p.read_text())
        for size in SIZES:
            rows = [r for r in res["rows"] if r["size"] == size]
            d = next(r for r in rows if r["setting"] == "default")
            others = [r for r in rows if r["setting"] != "default"]
            f = min(others, key=lambda r: r["seconds"])
            c = min(others, key=lambda r: r["cpu_seconds"])
            lines.append(f"| {res.get('codec', 'av1')} | {res['episodes']} x {res['frames']} | {size} | "
                         f"{d['seconds']:.2f} / {d['min_seconds']:.2f} | `{f['setting']}` | "
                         f"{f['seconds']:.2f} / {f['min_seconds']:.2f} | {d['vs_fastest_option']:.2f} | "
                         f"{d['vs_fastest_option_min']:.2f} | {d['cpu_seconds']:.2f} | "
                         f"`{c['setting']}` {c['cpu_seconds']:.2f} | workers {d['workers'].split(' ')[0]}, "
                         f"{d['decoder'].split(' ')[0]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--frames", type=int, default=60, help="frames per episode")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up round")
    ap.add_argument("--src", type=Path, help="dataset folder: made there if absent, reused if present")
    ap.add_argument("--codec", choices=["av1", "h264", "hevc"], default="av1", help="codec of the generated dataset")
    ap.add_argument("--cameras", type=int, default=3, help="video cameras of the generated dataset")
    ap.add_argument("--blank-cameras", type=int, default=1, help="how many of them are black")
    ap.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=DECODERS)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to time beside the default")
    ap.add_argument("--no-baselines", action="store_true",
                    help="leave out one-thread pure decode and the in-process --workers 1 runs")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, help="folder for convert.json / convert.md (default: a fresh one)")
    where.add_argument("--record", action="store_true", help=f"write into {RECORD.relative_to(ROOT)}/ (the record)")
    ap.add_argument("--compare", type=Path, nargs="+", help="print one table of these convert.json files, run nothing")
    args = ap.parse_args()
    if args.compare:
        return print(compare(args.compare))
    dest = RECORD if args.record else args.out or Path(tempfile.mkdtemp(prefix="bench-convert-results-"))
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        src = args.src or work / "src"
        t0 = time.perf_counter()
        cams = tuple(f"observation.images.cam{i}" for i in range(args.cameras))
        if not (src / "meta" / "info.json").exists():
            make_lerobot_dataset(src, version="v2.1", codec=args.codec, height=480, width=640, fps=15,
                                 cameras=cams, blank_cameras=cams[len(cams) - args.blank_cameras:],
                                 episode_lengths=[args.frames] * args.episodes, detail=1.0)
        gen_s = time.perf_counter() - t0
        load_start = os.getloadavg()
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        summaries: dict[tuple[str, str], dict] = {}
        pure: dict[str, list[tuple[float, float]]] = {}
        spec = scan(src)
        frames = sum(ref.length * len(ref.videos) for ref in spec.episodes)
        here: dict[str, list[tuple[float, float]]] = {}
        runs_of = settings(args.decoders, args.workers)
        for rnd in range(args.repeats + 1):  # round 0 warms up (page cache, imports) and is not counted
            if not args.no_baselines:
                dt, cpu, frames = pure_decode(src, "pyav")  # the default decoder's one-thread pure decode
                if rnd:
                    pure.setdefault("pyav", []).append((dt, cpu))
                for size in SIZES:
                    r = convert_here(src, work / "here", size)
                    if rnd:
                        here.setdefault(size, []).append(r)
            for size, label, flags in runs_of if rnd else [s for s in runs_of if s[1] == "default"]:
                dt, cpu, summ = run_convert(src, work / "out", flags)
                summaries[size, label] = summ
                if rnd:
                    runs.setdefault((size, label), []).append((dt, cpu))
        load_end = os.getloadavg()
        rows = []
        best: dict[str, float] = {}
        for (size, label), rs in runs.items():
            sec = statistics.median(r[0] for r in rs)
            best[size] = min(best.get(size, float("inf")), sec) if label != "default" else best.get(size, float("inf"))
            rows.append({"size": size, "setting": label, "seconds": sec, "min_seconds": min(r[0] for r in rs),
                         "all_seconds": [r[0] for r in rs], "cpu_seconds": statistics.median(r[1] for r in rs),
                         "cpu_per_wall": statistics.median(r[1] / r[0] for r in rs),
                         "camera_frames_per_s": frames / sec, "decoder": summaries[size, label]["decoder_why"],
                         "workers": summaries[size, label]["workers"]})
        for r in rows:
            r["vs_fastest_option"] = best[r["size"]] / r["seconds"]
            r["vs_fastest_option_min"] = min(x["min_seconds"] for x in rows
                                             if x["size"] == r["size"] and x["setting"] != "default") / r["min_seconds"]
        by = {(r["size"], r["setting"]): r for r in rows}
        ratios = {}
        pure_s = statistics.median(r[0] for r in pure["pyav"]) if pure else None
        for size in SIZES:
            ratios[f"default vs fastest option, {size}"] = (by[size, "default"]["vs_fastest_option"], ">= 0.90")
            if pure_s is not None:
                here_s = statistics.median(r[0] for r in here[size])
                ratios[f"--workers 1 (in-process convert()) vs 1-thread pure decode (pyav), {size}"] = (
                    pure_s / here_s, ">= 0.85")
        machine = (f"{platform.node()} {platform.machine()} {available_cpus()} cores, Python "
                   f"{platform.python_version()}, torch {torch.__version__}")
        command = "python " + " ".join(sys.argv)
        result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
                  "machine": machine, "codec": args.codec, "cameras": args.cameras, "blank_cameras": args.blank_cameras,
                  "episodes": args.episodes, "frames": args.frames, "repeats": args.repeats,
                  "camera_frames": frames, "load_avg_start": load_start, "load_avg_end": load_end,
                  "pure_decode_pyav_s": pure_s, "pure_decode_all_s": [r[0] for r in pure.get("pyav", [])],
                  "rows": rows, "in_process_workers1_s": {k: [r[0] for r in v] for k, v in here.items()},
                  "ratios": {k: v for k, (v, _) in ratios.items()}}
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "convert.json").write_text(json.dumps(result, indent=1))
        blank = f"{args.blank_cameras} black" if args.blank_cameras else "all real"
        md = ["# Conversion benchmark\n", f"- date: {result['date']}", f"- command: `{command}`",
              f"- machine: {machine}",
              f"- dataset: LeRobot v2.1, {args.episodes} episodes x {args.frames} frames, {args.cameras} cameras "
              f"480x640 {args.codec} ({ENCODER[args.codec]}; {blank}; textured content) = {frames} camera-frames"
              + (f", generated in {gen_s:.0f} s" if gen_s > 1 else ""),
              f"- each run is one `datakit convert SRC OUT --no-progress [flags]` process; settings interleaved, "
              f"median and minimum of {args.repeats} rounds after a warm-up round; 1-minute load average "
              f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end"]
        if pure_s is not None:
            md += [f"- one-thread pure decode (pyav, every video once, in order): {pure_s:.2f} s "
                   f"({frames / pure_s:.0f} camera-frames/s); `convert(..., ConvertConfig(workers=1))` in the same "
                   f"process, interleaved with it: " + ", ".join(
                       f"{k} {statistics.median(r[0] for r in v):.2f} s" for k, v in here.items())]
        md += ["", "| size | flags | seconds (median) | seconds (min) | camera-frames/s | CPU s / wall s | "
               "fastest option / this (median) |", "|---|---|---:|---:|---:|---:|---:|"]
        md += [f"| {r['size']} | `{r['setting']}` | {r['seconds']:.2f} | {r['min_seconds']:.2f} | "
               f"{r['camera_frames_per_s']:.0f} | {r['cpu_per_wall']:.2f} | {r['vs_fastest_option']:.2f} |" for r in rows]
        md += ["", "What the default command chose:", ""]
        md += [f"- {size}: decoder {by[size, 'default']['decoder']}; workers {by[size, 'default']['workers']}"
               for size in SIZES]
        md += ["", "| ratio | value | goal |", "|---|---:|---:|"]
        md += [f"| {k} | {v:.2f} | {goal} |" for k, (v, goal) in ratios.items()] + [""]
        (dest / "convert.md").write_text("\n".join(md))
        print("\n".join(md))
        print(f"wrote {dest / 'convert.md'} and convert.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

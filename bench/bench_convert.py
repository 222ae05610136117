"""Conversion benchmark: a 480x640 AV1 LeRobot dataset (LeRobot's encoder settings) converted at
native size and at 224x224, against the chosen decoder's pure decode rate on the same files,
measured in the same run. Also --workers 2 against --workers 1.

    python bench/bench_convert.py [--episodes 6] [--frames 60] [--repeats 3] [--out bench/results]

Goals (issue 2): conversion >= 85% of pure decode; --workers 2 >= 1.7x --workers 1 on 2 cores.
"workers 1" decodes each camera on its own thread (--camera-threads, the default when cores are left
over); the workers ratio compares two worker processes with one process without those threads.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datakit.machine import available_cpus  # noqa: E402
from datakit.convert.config import ConvertConfig  # noqa: E402
from datakit.convert import convert  # noqa: E402
from datakit.decoders import open_decoder  # noqa: E402
from datakit.sources import scan  # noqa: E402
from datakit.synth import make_lerobot_dataset  # noqa: E402


def cpu_seconds() -> float:
    """Process CPU time, this process and its finished children (the pool workers), all threads."""
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def pure_decode(src: Path, backend: str, part: tuple[int, int] = (0, 1)) -> tuple[float, int]:
    """Seconds and camera-frames to decode every video of the dataset once, sequentially, 1 thread
    (`part` = (k, n): only every n-th episode from the k-th)."""
    spec = scan(src)
    t0, n = time.perf_counter(), 0
    for ref in spec.episodes[part[0]::part[1]]:
        for vs in ref.videos.values():
            dec = open_decoder(vs.path, backend, threads=1)
            for chunk in dec.read_range(0, ref.length):
                n += len(chunk)
            dec.close()
    return time.perf_counter() - t0, n


def _decode_part(args: tuple[Path, str, int, int]) -> int:
    torch.set_num_threads(1)
    return pure_decode(args[0], args[1], (args[2], args[3]))[1]


def pure_decode_2proc(src: Path, backend: str) -> tuple[float, int]:
    """The machine's own two-process ceiling: the same decode split over two processes at once."""
    import multiprocessing as mp

    with mp.get_context("fork").Pool(2) as pool:
        pool.map(_decode_part, [(src, backend, 0, 2), (src, backend, 1, 2)])  # warm both processes
        t0 = time.perf_counter()
        n = sum(pool.map(_decode_part, [(src, backend, 0, 2), (src, backend, 1, 2)]))
        return time.perf_counter() - t0, n


def disk_write_mb_s(work: Path, mb: int = 512) -> float:
    """fsync'd sequential write bandwidth of the output disk: the ceiling for native-size output."""
    buf = os.urandom(8 << 20)
    path = work / "disk-probe"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mb // 8):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    path.unlink()
    return mb / dt


def video_kb_per_frame(src: Path) -> float:
    spec = scan(src)
    files = [vs.path for r in spec.episodes for c, vs in r.videos.items() if c != "observation.images.side"]
    return sum(f.stat().st_size for f in files) / 1024 / sum(r.length for r in spec.episodes) / 2


SHARD_SIZE = 64 << 20  # several shards, so that workers have shards to share


def timed_convert(src: Path, work: Path, **kw) -> tuple[float, int, dict]:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    s = convert(src, out, ConvertConfig(progress=False, shard_size=SHARD_SIZE, **kw))
    dt = time.perf_counter() - t0
    frames = s.index.num_frames * sum(1 for c in s.index.cameras.values() if c.status != "missing")
    return dt, frames, s.decoders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--frames", type=int, default=60, help="frames per episode")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        src = work / "src"
        t0 = time.perf_counter()
        make_lerobot_dataset(src, version="v2.1", codec="av1", height=480, width=640, fps=15,
                             episode_lengths=[args.frames] * args.episodes, detail=1.0)
        gen_s = time.perf_counter() - t0
        backend = open_decoder(scan(src).episodes[0].videos["observation.images.top"].path, "auto").backend
        rows = []

        def med(fn):
            fn()  # warm-up: imports, decoder libraries, page cache of the sources
            runs = []
            for _ in range(args.repeats):
                c0 = cpu_seconds()
                r = fn()
                runs.append((*r, (cpu_seconds() - c0) / r[0]))
            runs.sort(key=lambda r: r[0])
            return runs[len(runs) // 2]

        def add(label, r, cpu=True):
            rows.append({"what": label, "seconds": r[0], "camera_frames": r[1], "cpu_per_wall": r[-1] if cpu else None})

        for dec in dict.fromkeys([backend, "pyav"]):  # the chosen decoder, and PyAV (strictly one core)
            add(f"pure decode ({dec}, 1 thread)", med(lambda: pure_decode(src, dec)))
            add(f"pure decode ({dec}, 1 thread), 2 processes at once", med(lambda: pure_decode_2proc(src, dec)), cpu=False)
            for label, kw in [("convert native, workers 1", dict(workers=1)),
                              ("convert 224x224, workers 1", dict(workers=1, resize="224x224")),
                              ("convert native, workers 1, no camera threads", dict(workers=1, camera_threads=False)),
                              ("convert 224x224, workers 1, no camera threads", dict(workers=1, camera_threads=False, resize="224x224")),
                              ("convert native, workers 2", dict(workers=2)),
                              ("convert 224x224, workers 2", dict(workers=2, resize="224x224"))]:
                add(f"{label} ({dec})", med(lambda: timed_convert(src, work, decoder=dec, **kw)))
        for r in rows:
            r["camera_frames_per_s"] = r["camera_frames"] / r["seconds"]
        disk = disk_write_mb_s(work)
        kb = video_kb_per_frame(src)
        by = {r["what"]: r["camera_frames_per_s"] for r in rows}
        ratios = {}
        for dec in dict.fromkeys([backend, "pyav"]):
            base = by[f"pure decode ({dec}, 1 thread)"]
            ratios[f"native_vs_decode ({dec})"] = by[f"convert native, workers 1 ({dec})"] / base
            ratios[f"224_vs_decode ({dec})"] = by[f"convert 224x224, workers 1 ({dec})"] / base
            ratios[f"workers2_vs_1_native ({dec})"] = by[f"convert native, workers 2 ({dec})"] / by[f"convert native, workers 1, no camera threads ({dec})"]
            ratios[f"workers2_vs_1_224 ({dec})"] = by[f"convert 224x224, workers 2 ({dec})"] / by[f"convert 224x224, workers 1, no camera threads ({dec})"]
            ratios[f"machine_2proc_vs_1_decode ({dec})"] = by[f"pure decode ({dec}, 1 thread), 2 processes at once"] / base
        result = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join(sys.argv),
            "machine": f"{platform.node()} {platform.machine()} {available_cpus()} cores, {platform.python_version()}, torch {torch.__version__}",
            "dataset": f"LeRobot v2.1, {args.episodes} episodes x {args.frames} frames, 3 cameras 480x640 AV1 "
                       f"(libsvtav1 crf=30 g=2; one camera black; textured content), generated in {gen_s:.0f} s",
            "decoder": backend, "repeats": args.repeats, "rows": rows, "ratios": ratios,
            "disk_write_mb_s_fsync": disk, "video_kb_per_real_frame": kb,
            "disk_ceiling_native_camera_frames_per_s": disk * 2**20 / (480 * 640 * 3 + 1024),
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "convert.json").write_text(json.dumps(result, indent=1))
        md = ["# Conversion benchmark\n", f"- date: {result['date']}", f"- command: `{result['command']}`",
              f"- machine: {result['machine']}", f"- dataset: {result['dataset']}",
              f"- video: {kb:.1f} KiB per real camera frame; output disk: {disk:.0f} MB/s fsync'd sequential write "
              f"(= {result['disk_ceiling_native_camera_frames_per_s']:.0f} native 480x640 camera-frames/s at most)",
              f"- median of {args.repeats} runs after a warm-up run; rates in camera-frames/s (3 cameras per frame); "
              f"--shard-size {SHARD_SIZE >> 20} MiB; load average at start {os.getloadavg()[0]:.2f}\n",
              "| run | seconds | camera-frames/s | CPU s / wall s |", "|---|---:|---:|---:|"]
        md += [f"| {r['what']} | {r['seconds']:.2f} | {r['camera_frames_per_s']:.1f} | "
               f"{'n/a' if r['cpu_per_wall'] is None else format(r['cpu_per_wall'], '.2f')} |" for r in rows]
        goals = {"native_vs_decode": ">= 0.85", "224_vs_decode": ">= 0.85", "workers2_vs_1_native": ">= 1.7",
                 "workers2_vs_1_224": ">= 1.7", "machine_2proc_vs_1_decode": "(ceiling, no goal)"}
        md += ["", "| ratio | value | goal |", "|---|---:|---:|"]
        md += [f"| {k} | {v:.2f} | {goals[k.split(' ')[0]]} |" for k, v in ratios.items()] + [""]
        (args.out / "convert.md").write_text("\n".join(md))
        print("\n".join(md))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

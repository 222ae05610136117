"""Loader benchmark on the CPU machine: image bytes/s of `for batch in ShardLoader(...)` against a
single-thread page-cache read of the same shards, at native 480x640 and at 224x224; items/s
against stock LeRobotDataset; host-to-device bytes per batch.

    .venv/bin/python bench/data/bench_loader.py                 # writes a fresh /tmp/bench_loader/run-<time>/
    .venv/bin/python bench/data/bench_loader.py --out DIR       # writes DIR/loader_cpu.json
    .venv/bin/python bench/data/bench_loader.py --record        # writes bench/results/loader_cpu.json (the record)
    .venv/bin/python bench/data/bench_loader.py --device-fixture .loader-fixtures   # data for the GPU run
    .venv/bin/python bench/data/bench_loader.py --data 480x640 --settings lent_w2,lent_w0 --loader-only --out DIR
                                                           # one part: those settings on that data only
    .venv/bin/python bench/data/bench_loader.py --data 480x640 --read-batch 200 --out DIR
                                                           # the CPU cost of one batch's read and of one loader
                                                           # batch, one folder against its 2-source mixture

Data: synthetic LeRobot v3.0 datasets (datakit.synth; AV1, 3 cameras, one of them black),
converted to rgb shards and cached under --work between runs: 8 episodes x 100 frames at 480x640
(2.1 GB of shards, 25 batches an epoch) and 12 x 80 at 224x224. The page cache must hold them
(checked). Samples are Pi0.5-shaped (current frame of 3 slots, the blank one pruned, 50 future
actions), batch 32, shuffled. Each setting is timed for --seconds in all, split over --rounds
rounds; every round reads the shards from the page cache first, so each loader number has the
page-cache read of the same minute beside it (medians over rounds). `copy` is
`lend_batches=False`: every batch copied into new memory, the loader's behaviour before lending.
LeRobot runs in its own Python 3.12 venv (tools/lerobot_oracle) through a subprocess.
`mix` is a 2-source mixture (datakit/loader/mixture.py) of the same folder under two names, weights
0.5/0.5: the same bytes as the single-source rows, so the difference is the mixture's own cost
(schedule, two sources' reads into one buffer, padding): the goal is within 5% of `lent`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from datakit.machine import available_cpus  # noqa: E402
from datakit.loader import LoaderConfig, MixtureSource, ShardLoader, h2d_bytes  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402

CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
# Pi0.5-shaped samples: the fields trainkit's pi05 loader preset sets (trainkit/models/pi05/batches.py)
PI05_SHAPE = {"frame_offsets": (0,), "action_horizon": 50, "norm": "quantile"}
LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ORACLE = ROOT / "tools" / "lerobot_oracle" / "lerobot_oracle.py"
# (name, episodes, frames per episode, height, width)
DATASETS = (("480x640", 8, 100, 480, 640), ("224x224", 12, 80, 224, 224))
# (name, workers, lend); "mix": a 2-source mixture of the same shards, lent
SETTINGS = (("lent", 2, True), ("copy", 2, False), ("lent", 0, True), ("copy", 0, False), ("mix", 2, True),
            ("mix", 0, True))


def build(work: Path, episodes: int, length: int, height: int, width: int, layout: str,
          rebuild: bool) -> tuple[Path, Path]:
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    src, out = work / "src", work / f"out-{layout}"
    if rebuild or not (src / "meta" / "info.json").exists():
        make_lerobot_dataset(src, version="v3.0", episode_lengths=(length,) * episodes, height=height, width=width,
                             cameras=CAMS, blank_cameras=(CAMS[2],))
        shutil.rmtree(out, ignore_errors=True)
    if not (out / "index.json").exists():
        convert(src, out, ConvertConfig(workers=available_cpus(), progress=False, layout=layout,
                                        shard_size=256 << 20))
    return src, out


def check_page_cache(folders: list[Path]) -> None:
    """Exit 2 unless the shards fit in memory with room to spare: a read from disk is no page-cache read."""
    need = sum(s.bytes for out in folders for s in load_index(out).shards)
    avail = next(int(ln.split()[1]) << 10 for ln in open("/proc/meminfo") if ln.startswith("MemAvailable:"))
    if need * 3 // 2 > avail:
        sys.exit(f"bench_loader: the shards ({need / 2**30:.1f} GiB) do not fit the page cache "
                 f"({avail / 2**30:.1f} GiB available); use a machine with more memory")


def page_cache_read(out: Path, seconds: float) -> float:
    """Bytes/s of reading every shard from the page cache, one thread, 8 MiB `readinto`, in
    whole passes until `seconds` have gone by."""
    buf = bytearray(8 << 20)
    names = [out / s.name for s in load_index(out).shards]
    total, t0 = 0, time.perf_counter()
    while total == 0 or time.perf_counter() - t0 < seconds:
        for name in names:
            with open(name, "rb", buffering=0) as fh:
                while n := fh.readinto(buf):
                    total += n
    return total / (time.perf_counter() - t0)


def loader_root(out: Path, mixture: bool) -> Path | list[MixtureSource]:
    """The folder, or a 2-source mixture of it under two names (the same bytes)."""
    if not mixture:
        return out
    return [MixtureSource(root=str(out), weight=0.5, name="a"), MixtureSource(root=str(out), weight=0.5, name="b")]


def loader_rate(out: Path, workers: int, lend: bool, seconds: float, mixture: bool = False) -> dict:
    """`for batch in loader` for `seconds` (after 3 warm-up batches), across epochs. Beside the
    rates: the items per CPU-second of this process (all of the loader's work without workers; the
    receiving side with them), of its worker processes (the items taken over the workers' CPU time
    in the same window) and the fastest batch interval: numbers a shared machine's other load moves
    much less than the wall-clock rate."""
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=workers, slots=CAMS, seed=0, lend_batches=lend)
    loader = ShardLoader(loader_root(out, mixture), cfg)
    items = img_bytes = n = 0
    t0 = end = cpu0 = last = None
    best = float("inf")
    while end is None or time.perf_counter() < end:
        for batch in loader:
            n += 1
            now = time.perf_counter()
            if n == 3:  # the first batches start the workers; not steady state
                t0 = last = now
                cpu0, workers0 = time.process_time(), _children_cpu()
                end = t0 + seconds
            elif n > 3:
                items += batch["row"].numel()
                img_bytes += batch["images"].nbytes
                kept = int(batch["images"].shape[1])
                best, last = min(best, now - last), now
            if end is not None and time.perf_counter() >= end:
                break
    dt = time.perf_counter() - t0
    cpu, worker_cpu = time.process_time() - cpu0, _children_cpu() - workers0
    loader.close()
    return {"items_per_s": items / dt, "image_bytes_per_s": img_bytes / dt, "seconds": dt,
            "batches": n - 3, "kept_slots": kept, "items_per_cpu_s": items / cpu,
            "worker_items_per_cpu_s": items / worker_cpu if workers and worker_cpu > 0 else None,
            "best_batch_items_per_s": cfg.batch_size / best}


def read_batch_cost(out: Path, batches: int) -> dict:
    """CPU time of `read_batch` (what a worker does per batch: the coalesced reads into a reused
    buffer) over `batches` Pi0.5-shaped batches of 32 in the sampler's order, each timed alone: min
    and median; for the folder (`read_batch`) and for the 2-source mixture of it (`read_batch_mix`,
    `MixtureDataset` in its own order), their batches interleaved so both see the same load. The
    least a shared machine's other load can bend: a comparison of two versions of the loader on a
    busy machine reads these."""
    from datakit.loader import ShardDataset, epoch_order
    from datakit.loader.mixture_dataset import MixtureDataset

    cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, slots=CAMS, seed=0)
    one = ShardDataset(out, cfg)
    mix = MixtureDataset(tuple(loader_root(out, True)), cfg)
    runs = {"read_batch": (one, epoch_order(len(one), seed=0, epoch=0, mode="random")),
            "read_batch_mix": (mix, np.arange(len(mix)))}
    buf = torch.empty(32 * len(CAMS) * (1 << 20), dtype=torch.uint8)  # one reused buffer, as a worker's ring
    alloc = lambda shape: buf[: int(np.prod(shape))].view(shape)  # noqa: E731
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(-1, batches):  # batch -1 warms: the shard files open
        for name, (ds, order) in runs.items():
            pos = order[(max(i, 0) * 32) % (len(order) - 32):][:32].tolist()
            t = time.process_time()
            ds.read_batch(pos, alloc=alloc)
            if i >= 0:
                times[name].append(time.process_time() - t)
    one.close()
    mix.close()
    return {name: {"batches": batches, "min_cpu_s": min(ts), "median_cpu_s": statistics.median(ts),
                   "items_per_cpu_s_at_min": 32 / min(ts), "items_per_cpu_s_at_median": 32 / statistics.median(ts)}
            for name, ts in times.items()}


def loader_cpu_interleaved(out: Path, batches: int) -> dict:
    """Process CPU time of `next()` on the folder's loader and on its 2-source mixture's (0 workers,
    lent), their batches alternated so both see the same load: the loader-level cost of a mixture."""
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=0, slots=CAMS, seed=0)
    loaders = {"loader_w0": ShardLoader(out, cfg), "loader_w0_mix": ShardLoader(loader_root(out, True), cfg)}
    streams = {name: _endless(loader) for name, loader in loaders.items()}
    times: dict[str, list[float]] = {name: [] for name in loaders}
    for i in range(-3, batches):  # 3 warm-up batches each
        for name, stream in streams.items():
            t = time.process_time()
            batch = next(stream)
            if i >= 0:
                times[name].append(time.process_time() - t)
            del batch  # back to the ring
    for loader in loaders.values():
        loader.close()
    return {name: {"batches": batches, "median_cpu_s": statistics.median(ts), "mean_cpu_s": statistics.fmean(ts),
                   "items_per_cpu_s_at_median": 32 / statistics.median(ts)} for name, ts in times.items()}


def _endless(loader: ShardLoader):
    while True:  # the loader's iterator ends with its epoch
        yield from loader


def _children_cpu() -> float:
    """CPU seconds so far of this process's live child processes (the loader's workers; Linux /proc)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:  # fields after the command's ")": utime and stime are the 12th and 13th
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            total += int(stat[11]) + int(stat[12])
    return total / os.sysconf("SC_CLK_TCK")


def compare(out: Path, seconds: float, rounds: int, settings: tuple = SETTINGS) -> dict:
    """Every setting and the page-cache read, interleaved over `rounds` rounds."""
    page_cache_read(out, 0)  # warm: the first pass may still touch the disk
    res = {"page_cache_bytes_per_s": [], **{f"{name}_w{w}": [] for name, w, _ in settings}}
    for _ in range(rounds):
        res["page_cache_bytes_per_s"].append(page_cache_read(out, seconds / rounds))
        for name, w, lend in settings:
            res[f"{name}_w{w}"].append(loader_rate(out, w, lend, seconds / rounds, mixture=name == "mix"))
    pc = res["page_cache_bytes_per_s"]
    summary = {"page_cache_bytes_per_s": statistics.median(pc), "page_cache_rounds": pc}
    for name, w, lend in settings:
        runs = res[f"{name}_w{w}"]
        summary[f"{name}_w{w}"] = {
            "workers": w, "lend_batches": lend, "seconds": sum(r["seconds"] for r in runs),
            "items_per_s": statistics.median(r["items_per_s"] for r in runs),
            "image_bytes_per_s": statistics.median(r["image_bytes_per_s"] for r in runs),
            "items_per_cpu_s": statistics.median(r["items_per_cpu_s"] for r in runs),
            "worker_items_per_cpu_s": statistics.median(r["worker_items_per_cpu_s"] for r in runs) if w else None,
            "best_batch_items_per_s": max(r["best_batch_items_per_s"] for r in runs),
            # each round against the page-cache read of the same round
            "fraction_of_page_cache": statistics.median(r["image_bytes_per_s"] / p for r, p in zip(runs, pc)),
            "rounds": runs,
        }
    return summary


def lerobot(src: Path, workers: int, batches: int, tmp: Path) -> dict:
    if not LEROBOT_PY.exists():
        return {"error": f"{LEROBOT_PY} missing: python3.12 -m venv /tmp/lerobot-venv && "
                         "/tmp/lerobot-venv/bin/pip install 'lerobot[dataset]==0.6.1'"}
    res = tmp / f"lerobot-{workers}.json"
    delta = json.dumps({"action": [i / 10 for i in range(50)]})
    cmd = [str(LEROBOT_PY), str(ORACLE), "bench", str(src), str(res), "--batch-size", "32", "--workers",
           str(workers), "--batches", str(batches), "--delta", delta]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return {"error": p.stderr[-2000:]}
    return json.loads(res.read_text())


def h2d_table(out: Path) -> dict:
    """Bytes per Pi0.5-shaped batch (32 samples, 3 slots of 224x224, 2 real) moved host-to-device."""
    rows = {}
    for name, prune in (("pruned", True), ("all_slots", False)):
        batch = next(iter(ShardLoader(out, LoaderConfig(**PI05_SHAPE, batch_size=32, slots=CAMS, prune_slots=prune))))
        img = batch["images"]
        rest = h2d_bytes(batch) - img.nbytes
        rows[f"uint8_{name}"] = {"images": img.nbytes, "total": h2d_bytes(batch), "slots": int(img.shape[1])}
        f32 = img.numel() * 4  # the same images as float32 RGB CHW, as a float host pipeline sends them
        rows[f"float32_{name}"] = {"images": f32, "total": f32 + rest, "slots": int(img.shape[1])}
    return rows


def device_fixture(dest: Path) -> None:
    """Small shard folders for the GPU run (the device has no video decoder to convert there)."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from loader_fixtures import build as build_test

    dest.mkdir(parents=True, exist_ok=True)
    for layout in ("rgb", "nv12"):
        shutil.rmtree(dest / layout, ignore_errors=True)
        build_test(dest / layout, layout)
        shutil.rmtree(dest / layout / "src")
    _, out = build(dest / "bench", episodes=4, length=30, height=224, width=224, layout="nv12", rebuild=True)
    shutil.rmtree(dest / "bench" / "src")
    total = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"device fixtures in {dest}: {total / 2**20:.1f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_loader"), help="datasets are built and cached here")
    p.add_argument("--seconds", type=float, default=6.0, help="timed seconds per setting, over all rounds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lerobot-batches", type=int, default=8)
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--device-fixture", type=Path, default=None)
    p.add_argument("--data", default=",".join(d[0] for d in DATASETS),
                   help="comma list of the datasets to run (default: all: " + ", ".join(d[0] for d in DATASETS) + ")")
    p.add_argument("--settings", default=",".join(f"{n}_w{w}" for n, w, _ in SETTINGS),
                   help="comma list of the loader settings to time (default: all)")
    p.add_argument("--read-batch", type=int, default=0, metavar="N",
                   help="only time N single batch reads (`read_batch_cost`) and N loader batches (0 workers, "
                        "`loader_cpu_interleaved`), each of the folder and of its mixture, on each dataset of --data")
    p.add_argument("--loader-only", action="store_true",
                   help="time the loader settings only (no CPU-normalised row, LeRobot or host-to-device table)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None, help="folder for loader_cpu.json (default: a fresh one)")
    where.add_argument("--record", action="store_true", help="write bench/results/loader_cpu.json")
    args = p.parse_args()
    if args.device_fixture:
        return device_fixture(args.device_fixture)
    dest = ROOT / "bench" / "results" if args.record else args.out or args.work / time.strftime("run-%Y%m%d-%H%M%S")

    names = args.data.split(",")
    settings = tuple(st for st in SETTINGS if f"{st[0]}_w{st[1]}" in args.settings.split(","))
    built = {name: build(args.work / name, eps, length, h, w, "rgb", args.rebuild)
             for name, eps, length, h, w in DATASETS if name in names}
    check_page_cache([out for _, out in built.values()])
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": _machine(), "loadavg_start": _loadavg(), "datasets": {}, "loader": {}}
    for name, (src, out) in built.items():
        info = load_index(out).info()
        res["datasets"][name] = {k: info[k] for k in ("num_episodes", "num_frames", "bytes")}
        if args.read_batch:
            res["loader"][name] = {**read_batch_cost(out, args.read_batch),
                                   **loader_cpu_interleaved(out, args.read_batch)}
            continue
        res["loader"][name] = compare(out, args.seconds, args.rounds, settings)
    if not (args.loader_only or args.read_batch):
        src224, out224 = built["224x224"]
        res["ours_cpu_normalised"] = _ours_normalised(out224, 2, 40)
        res["lerobot"] = lerobot(src224, 2, args.lerobot_batches, args.work)
        if "items_per_s" in res["lerobot"]:
            res["ratio_items_per_s"] = (res["loader"]["224x224"]["lent_w2"]["items_per_s"]
                                        / res["lerobot"]["items_per_s"])
        res["h2d_bytes"] = h2d_table(out224)
    res["loadavg_end"] = _loadavg()
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "loader_cpu.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    print(f"\nwritten: {dest / 'loader_cpu.json'}; load average {res['loadavg_start']} -> {res['loadavg_end']}")
    if not args.read_batch:
        print(table(res))


def table(res: dict) -> str:
    """The loader settings beside the page-cache read, per resolution (medians over rounds)."""
    lines = ["| data | setting | workers | items/s | image GB/s | of page-cache read |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, r in res["loader"].items():
        lines.append(f"| {name} | page-cache read, 1 thread | - | - | {r['page_cache_bytes_per_s'] / 1e9:.2f} | 100% |")
        for key, s in r.items():
            if isinstance(s, dict):
                lines.append(f"| {name} | {key.split('_')[0]} | {s['workers']} | {s['items_per_s']:,.0f} | "
                             f"{s['image_bytes_per_s'] / 1e9:.2f} | {100 * s['fraction_of_page_cache']:.0f}% |")
    return "\n".join(lines)


def _ours_normalised(out: Path, workers: int, batches: int) -> dict:
    """Ours with normalisation to float32 CHW on the CPU: the like-for-like output of LeRobotDataset."""
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=workers, slots=CAMS, image_dtype="float32",
                       pin_memory=False)
    loader = ShardLoader(out, cfg)
    it = loader.device_batches("cpu")
    for _ in range(3):
        next(it)
    n, t0 = 0, time.perf_counter()
    for _ in range(batches):
        n += next(it)["row"].numel()
    dt = time.perf_counter() - t0
    return {"workers": workers, "items_per_s": n / dt, "seconds": dt}


def _loadavg() -> list[float]:
    """1, 5 and 15-minute load averages: the machine may be shared, so each run records them."""
    return [float(x) for x in open("/proc/loadavg").read().split()[:3]]


def _machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return f"{platform.node()}: {model}, {available_cpus()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    main()

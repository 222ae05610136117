"""Loader benchmark on the CPU machine: items/s against stock LeRobotDataset, image bytes/s
against the page-cache read bandwidth, and host-to-device bytes per batch.

    .venv/bin/python bench/bench_loader.py                    # writes bench/results/loader_cpu.json
    .venv/bin/python bench/bench_loader.py --device-fixture .loader-fixtures   # data for the GPU run

Both loaders read the same synthetic LeRobot v3.0 dataset (datakit.synth; AV1, 3 cameras at
224x224, one of them black): LeRobotDataset decodes the mp4s, ours reads the shards that
`datakit.convert` made of it. Same cameras, resolution, batch size (32), samples (Pi0.5:
current frame + 50 future actions, padded at episode ends), worker count and cores. Every
ratio is against a baseline measured in the same run. LeRobot runs in its own Python 3.12
venv (tools/lerobot_oracle) through a subprocess.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from datakit.machine import available_cpus  # noqa: E402
from datakit.loader import ShardLoader, h2d_bytes, pi05_config  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402

CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ORACLE = ROOT / "tools" / "lerobot_oracle" / "lerobot_oracle.py"


def build(work: Path, episodes: int, length: int, size: int, layout: str, rebuild: bool) -> tuple[Path, Path]:
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    src, out = work / "src", work / f"out-{layout}"
    if rebuild or not (src / "meta" / "info.json").exists():
        make_lerobot_dataset(src, version="v3.0", episode_lengths=(length,) * episodes, height=size, width=size,
                             cameras=CAMS, blank_cameras=(CAMS[2],))
        shutil.rmtree(out, ignore_errors=True)
    if not (out / "index.json").exists():
        convert(src, out, ConvertConfig(workers=available_cpus(), progress=False, layout=layout,
                                        shard_size=64 << 20))
    return src, out


def page_cache_bandwidth(out: Path, repeats: int = 3) -> float:
    """Bytes/s of reading every shard once from the page cache (warmed first), 8 MiB reads."""
    files = [out / s.name for s in load_index(out).shards]
    buf = bytearray(8 << 20)
    best = 0.0
    for r in range(repeats + 1):
        total, t0 = 0, time.perf_counter()
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while n := fh.readinto(buf):
                    total += n
        if r:  # the first pass only warms the cache
            best = max(best, total / (time.perf_counter() - t0))
    return best


def ours(out: Path, workers: int, batches: int, cfg_kw: dict) -> dict:
    cfg = pi05_config(batch_size=32, num_workers=workers, slots=CAMS, seed=0, **cfg_kw)
    loader = ShardLoader(out, cfg)
    items, img_bytes, n = 0, 0, 0
    t0 = None
    while n < batches + 3:
        for batch in loader:
            if n == 3:  # the first batches start the workers; not steady state
                t0 = time.perf_counter()
            if n >= 3:
                items += batch["row"].numel()
                img_bytes += batch["images"].nbytes
            n += 1
            if n >= batches + 3:
                break
    dt = time.perf_counter() - t0
    return {"workers": workers, "items": items, "seconds": dt, "items_per_s": items / dt,
            "image_bytes_per_s": img_bytes / dt, "kept_slots": int(batch["images"].shape[1])}


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
        batch = next(iter(ShardLoader(out, pi05_config(batch_size=32, slots=CAMS, prune_slots=prune))))
        img = batch["images"]
        rest = h2d_bytes(batch) - img.nbytes
        rows[f"uint8_{name}"] = {"images": img.nbytes, "total": h2d_bytes(batch), "slots": int(img.shape[1])}
        f32 = img.numel() * 4  # the same images as float32 RGB CHW, as a float host pipeline sends them
        rows[f"float32_{name}"] = {"images": f32, "total": f32 + rest, "slots": int(img.shape[1])}
    return rows


def device_fixture(dest: Path) -> None:
    """Small shard folders for the GPU run (the device has no video decoder to convert there)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_loader_fixtures import build as build_test

    dest.mkdir(parents=True, exist_ok=True)
    for layout in ("rgb", "nv12"):
        shutil.rmtree(dest / layout, ignore_errors=True)
        build_test(dest / layout, layout)
        shutil.rmtree(dest / layout / "src")
    _, out = build(dest / "bench", episodes=4, length=30, size=224, layout="nv12", rebuild=True)
    shutil.rmtree(dest / "bench" / "src")
    total = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"device fixtures in {dest}: {total / 2**20:.1f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_loader"))
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--length", type=int, default=80)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--lerobot-batches", type=int, default=8)
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--device-fixture", type=Path, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "loader_cpu.json")
    args = p.parse_args()
    if args.device_fixture:
        return device_fixture(args.device_fixture)

    src, out = build(args.work, args.episodes, args.length, 224, "rgb", args.rebuild)
    info = load_index(out).info()
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M"),
           "machine": _machine(), "loadavg_start": _loadavg(), "dataset": {k: info[k] for k in ("num_episodes", "num_frames", "bytes")},
           "page_cache_bytes_per_s": page_cache_bandwidth(out)}
    res["ours"] = ours(out, args.workers, args.batches, {})
    res["ours_single_process"] = ours(out, 0, args.batches, {})
    res["ours_cpu_normalised"] = _ours_normalised(out, args.workers, args.batches)
    res["lerobot"] = lerobot(src, args.workers, args.lerobot_batches, args.work)
    res["h2d_bytes"] = h2d_table(out)
    if "items_per_s" in res["lerobot"]:
        res["ratio_items_per_s"] = res["ours"]["items_per_s"] / res["lerobot"]["items_per_s"]
        res["ratio_cpu_normalised"] = res["ours_cpu_normalised"]["items_per_s"] / res["lerobot"]["items_per_s"]
    res["bandwidth_fraction"] = res["ours"]["image_bytes_per_s"] / res["page_cache_bytes_per_s"]
    res["loadavg_end"] = _loadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


def _ours_normalised(out: Path, workers: int, batches: int) -> dict:
    """Ours with normalisation to float32 CHW on the CPU: the like-for-like output of LeRobotDataset."""
    cfg = pi05_config(batch_size=32, num_workers=workers, slots=CAMS, image_dtype="float32", pin_memory=False)
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

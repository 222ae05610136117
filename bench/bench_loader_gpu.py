"""Loader benchmark on the GPU machine: host-to-device copy (pinned vs pageable, uint8 vs
float32, pruned vs all slots), on-device normalisation time, and the data wait of a dummy
training step with 1, 2 and 4 DataLoader workers.

    python3 bench/bench_loader_gpu.py --fixtures .loader-fixtures/bench/out-nv12 --out $OUT/loader_gpu.json

The fixture is made on a machine with a video decoder (`bench/bench_loader.py --device-fixture`):
3 cameras at 224x224 (one blank), stored NV12. The dummy consumer launches bf16 matmuls
sized to a target step time, reads the batch, and synchronises once per step as a training
loop logging its loss does. Data wait = host time blocked in `next()` of the device batch
iterator, as a share of the whole step. Timings use CUDA events or synchronised wall clocks.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from datakit.machine import available_cpus  # noqa: E402
from datakit import open_shards
from datakit.loader import Normaliser, ShardLoader, pi05_config  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402

CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")


def cuda_ms(fn, reps: int = 30, warmup: int = 5) -> float:
    """Median milliseconds of `fn` by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def h2d(batch_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict:
    out = {}
    for name, (shape, dtype) in batch_shapes.items():
        host = torch.randint(0, 255, shape, dtype=torch.uint8).to(dtype)
        pinned = host.pin_memory()
        nbytes = host.numel() * host.element_size()
        for kind, src in (("pinned", pinned), ("pageable", host)):
            ms = cuda_ms(lambda: src.to("cuda", non_blocking=True))
            out[f"{name}/{kind}"] = {"bytes": nbytes, "ms": ms, "GB_per_s": nbytes / ms / 1e6}
    return out


def normalise_timing(index) -> dict:
    """uint8 (32, 3 slots, 1 frame) 224x224 -> normalised bf16 NCHW, rgb and nv12 input; nv12
    both by the folded two-pass path (`datakit.loader.nv12`, the default) and by the general
    path (colour conversion to float RGB, then scaling), checked against each other."""
    out = {}
    for layout, shape in (("rgb", (32, 3, 1, 224, 224, 3)), ("nv12", (32, 3, 1, 336, 224))):
        index.layout = layout
        norm = Normaliser.from_index(index, pi05_config(image_dtype="bfloat16")).to("cuda")
        x = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")
        y = norm.images(x)
        assert y.shape == (32, 3, 1, 3, 224, 224) and y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
        out[layout] = {"ms": cuda_ms(lambda: norm.images(x)), "out_bytes": y.numel() * 2}
        if layout == "nv12":
            general = Normaliser.from_index(index, pi05_config(image_dtype="bfloat16")).to("cuda")
            general.fused_nv12 = None
            g = general.images(x)
            out["nv12_general"] = {"ms": cuda_ms(lambda: general.images(x)), "out_bytes": g.numel() * 2,
                                   "max_abs_diff_vs_fused": float((g.float() - y.float()).abs().max())}
    return out


def make_step(target_ms: float):
    """A dummy training step: reads the images, then bf16 matmuls for about `target_ms`."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    one = cuda_ms(lambda: a @ b, reps=10)
    n = max(1, round(target_ms / one))

    def step(batch) -> float:
        acc = batch["images"].float().mean() + batch["action"].mean()
        c = a
        for _ in range(n):
            c = c @ b
            c = c * (1.0 / 64.0)  # keeps values finite
        return float((c[0, 0].float() + acc * 0).item())  # one sync per step, like logging the loss
    return step


def data_wait(fixture: Path, workers: int, target_ms: float, steps: int) -> dict:
    step = make_step(target_ms)
    cfg = pi05_config(batch_size=32, num_workers=workers, slots=CAMS, prefetch_factor=4)
    loader = ShardLoader(fixture, cfg)
    it = loader.device_batches("cuda")
    for _ in range(5):  # workers start, allocator warms
        step(next(it))
    waits, totals = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        step(batch)
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        totals.append(t2 - t0)
    return {"workers": workers, "target_step_ms": target_ms, "steps": steps,
            "step_ms_median": 1e3 * statistics.median(totals), "wait_ms_median": 1e3 * statistics.median(waits),
            "wait_ms_max": 1e3 * max(waits), "wait_fraction": sum(waits) / sum(totals),
            "kept_slots": int(batch["images"].shape[1])}


def throughput(fixture: Path, workers: int, batches: int) -> dict:
    """Device batches per second with no consumer: the loader's own ceiling on this machine."""
    loader = ShardLoader(fixture, pi05_config(batch_size=32, num_workers=workers, slots=CAMS, prefetch_factor=4))
    it = loader.device_batches("cuda")
    for _ in range(5):
        next(it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        b = next(it)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    # host bytes per sample: the slots kept in the batch x the stored frame size from the index
    frame_bytes = open_shards(fixture).index.cameras[CAMS[0]].frame_bytes
    kept = int(b["images"].shape[1])
    return {"workers": workers, "items_per_s": batches * 32 / dt,
            "image_bytes_per_s_host": batches * 32 * kept * frame_bytes / dt}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixtures", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-ms", type=float, nargs="+", default=[100.0, 30.0])
    args = p.parse_args()
    assert torch.cuda.is_available(), "needs CUDA"
    res = {"command": " ".join(["python3", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cpus": available_cpus()}
    res["h2d"] = h2d({
        "uint8_pruned_2slots": ((32, 2, 1, 224, 224, 3), torch.uint8),
        "uint8_all_3slots": ((32, 3, 1, 224, 224, 3), torch.uint8),
        "nv12_pruned_2slots": ((32, 2, 1, 336, 224), torch.uint8),
        "float32_all_3slots": ((32, 3, 1, 3, 224, 224), torch.float32),
    })
    res["normalise"] = normalise_timing(load_index(args.fixtures))
    res["throughput"] = [throughput(args.fixtures, w, 60) for w in (1, 2, 4)]
    res["data_wait"] = [data_wait(args.fixtures, w, ms, args.steps) for ms in args.step_ms for w in (1, 2, 4)]
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

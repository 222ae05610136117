"""The host cost of the device batcher's `next()`, measured on a CPU machine with CUDA mocked.

    python bench/data/bench_loader_next.py                            # this checkout
    python bench/data/bench_loader_next.py --base /work/main          # another checkout's datakit
    python bench/data/bench_loader_next.py --compare a.json b.json    # both tables side by side

What it runs: `DeviceBatcher._cuda` (the training thread's `next()` and the feeder thread) with
the CUDA calls it makes replaced by Python stand-ins (streams, events, `set_device`, the
current-stream lookups), and the copy-and-normalise launch replaced by the CPU normaliser on a
small batch, so that the feeder does real torch work (which lets go of the GIL) and real Python
work beside the training thread. A dummy step of `--step-ms` runs torch ops on small tensors
for a few ms (GIL traffic, as a training step's launches), then sleeps to the step time, as a
step that waits on the GPU. Measured: the time the training thread spends in `next()` once the
feeder is ahead (median, p90, mean) and as a share of the step.

What it cannot show: the cost of the real CUDA calls. On the H200 host the profile put
`torch.cuda.current_stream()` at 70-77 us per `next()` (bench/results/loader.md); here it is a
Python stand-in. The data wait on the GPU is measured by bench/data/bench_loader_gpu.py.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class FakeEvent:
    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class FakeStream:
    _next = 1000

    def __init__(self, device=None, **_):
        FakeStream._next += 1
        self.cuda_stream = FakeStream._next

    def wait_event(self, ev) -> None:
        pass

    def __eq__(self, other) -> bool:
        return isinstance(other, FakeStream) and other.cuda_stream == self.cuda_stream

    __hash__ = object.__hash__


class StreamContext:  # `with torch.cuda.stream(s):`
    def __init__(self, stream) -> None:
        pass

    def __enter__(self) -> "StreamContext":
        return self

    def __exit__(self, *exc) -> bool:
        return False


def mock_cuda(torch) -> FakeStream:
    """Stand-ins for the CUDA calls of gpu_batch; returns the 'current' stream."""
    current = FakeStream()
    torch.cuda.current_stream = lambda device=None: current
    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda device: None
    torch.cuda.Stream = FakeStream
    torch.cuda.Event = FakeEvent
    torch.cuda.stream = StreamContext
    torch._C._cuda_getCurrentRawStream = lambda index: current.cuda_stream
    return current


def run(step_ms: float, steps: int, batch: int, side: int, depth: int) -> dict:
    import torch

    from datakit.loader import gpu_batch
    from datakit.loader.config import LoaderConfig
    from datakit.loader.normalise import Normaliser

    mock_cuda(torch)
    torch.set_num_threads(1)
    cfg = LoaderConfig(batch_size=batch)
    mean, std = torch.tensor(cfg.image_mean), torch.tensor(cfg.image_std)
    affine = (torch.full((6,), 0.5), torch.zeros(6))
    norm = Normaliser(cfg=cfg, layout="rgb", image_scale=1.0 / (255.0 * std), image_bias=-mean / std,
                      state_affine=affine, action_affine=affine)
    batcher = gpu_batch.DeviceBatcher(norm, "cpu", depth=depth, pin_memory=False)
    batcher.device = torch.device("cuda", 0)

    def launch(self, hb, ring, copy_stream, consumer):
        """The CPU normaliser stands for the copy and the normalisation: torch work, GIL released."""
        meta = {k: hb[k] for k in gpu_batch.HOST_KEYS if k in hb}
        dev = {k: v for k, v in hb.items() if k not in meta}
        out = self.normaliser(dev, epoch=int(hb["epoch"]), step=int(hb["step"]))
        ev = torch.cuda.Event()
        ev.record(copy_stream)
        return {**out, **meta}, ev, tuple(int(hb[k]) if k in hb else 0 for k in gpu_batch.HOST_KEYS)
    batcher._launch = types.MethodType(launch, batcher)

    images = torch.randint(0, 256, (batch, 2, 1, side, side, 3), dtype=torch.uint8)

    def host():
        for s in range(steps + 20):
            yield {"images": images, "image_mask": torch.ones(batch, 2, dtype=torch.bool),
                   "state": torch.randn(batch, 6), "action": torch.randn(batch, 50, 6),
                   "epoch": torch.tensor(0), "step": torch.tensor(s), "num_skipped": torch.tensor(0)}

    took = []
    it = batcher(host(), on_take=lambda e, s, n: took.append(s))
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def step() -> None:
        t0 = time.perf_counter()
        c = a
        for _ in range(200):  # launches: many small torch ops
            c = torch.tanh(c @ b)
        rest = step_ms / 1e3 - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)  # the sync on the GPU's work

    for _ in range(10):  # the feeder gets ahead
        next(it)
        step()
    waits = []
    for _ in range(steps):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
        step()
    assert took == list(range(len(took))), "batches out of order"
    us = sorted(1e6 * w for w in waits)
    return {"steps": steps, "step_ms": step_ms, "batch": batch, "side": side, "depth": depth,
            "next_us_median": statistics.median(us), "next_us_p90": us[int(0.9 * len(us))],
            "next_us_mean": statistics.fmean(us), "next_us_max": us[-1],
            "wait_fraction": sum(waits) / (len(waits) * step_ms / 1e3)}


def compare(paths: list[Path]) -> str:
    lines = ["| checkout | next() median | p90 | mean | max | share of a step |", "|---|---:|---:|---:|---:|---:|"]
    for p in paths:
        r = json.loads(p.read_text())
        lines.append(f"| {r['datakit']} | {r['next_us_median']:.1f} us | {r['next_us_p90']:.1f} us | "
                     f"{r['next_us_mean']:.1f} us | {r['next_us_max']:.0f} us | {100 * r['wait_fraction']:.3f}% |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, help="measure this checkout's datakit instead of this file's")
    p.add_argument("--step-ms", type=float, default=30.0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--side", type=int, default=32, help="image side of the small batch the feeder normalises")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--compare", type=Path, nargs="+")
    args = p.parse_args()
    if args.compare:
        return print(compare(args.compare))
    sys.path.insert(0, str(args.base or ROOT))
    res = run(args.step_ms, args.steps, args.batch, args.side, args.depth)
    res.update(datakit=str(args.base or ROOT), command=" ".join(["python", *sys.argv]),
               date=time.strftime("%Y-%m-%d %H:%M"), threads=threading.active_count())
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

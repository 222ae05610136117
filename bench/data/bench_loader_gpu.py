"""Loader benchmark on the GPU machine: host-to-device copy (pinned vs pageable, uint8 vs
float32, pruned vs all slots), on-device normalisation time, and the data wait of a dummy
training step with 1, 2 and 4 DataLoader workers, per loader variant.

    python3 bench/data/bench_loader_gpu.py --fixtures .loader-fixtures/bench/out-nv12 --out $OUT/loader_gpu.json
    python3 bench/data/bench_loader_gpu.py ... --parts wait --variants default ring_off --profile $OUT/profile.txt
    python3 bench/data/bench_loader_gpu.py --synth /tmp/lfx --out $OUT/w.json --parts wait --workers 2 --step-ms 30
    python3 bench/data/bench_loader_gpu.py --synth /tmp/lfx ... --mixture 0.7 0.3   # + the rows of a 2-source mixture
    python3 bench/data/bench_loader_gpu.py --compare before.json after.json     # the data-wait table of both

Fixtures: `--fixtures DIR [DIR]`, made on a machine with a video decoder (`bench/data/bench_loader.py
--device-fixture`: 3 cameras at 224x224, one blank, stored NV12); or `--synth DIR`, made here with
no video decoder (a GPU host has none): LeRobot v2.1 datasets whose 2 cameras are PNG image columns
at 224x224 (`datakit.synth`), converted to NV12 shards by `datakit convert` (cached in DIR), the
same bytes per sample as the pruned decoder fixture. `--mixture W1 W2` adds the data-wait rows of
a loader reading the fixtures as a weighted mixture (`ShardLoader({dir: weight, ...})`, issue 27);
a checkout whose loader reads one source records why not and measures the single source alone. The dummy consumer launches bf16 matmuls
sized to a target step time, reads the batch, and synchronises once per step as a training
loop logging its loss does. Data wait = host time blocked in `next()` of the device batch
iterator, as a share of the whole step. Timings use CUDA events or synchronised wall clocks.
A variant is a set of LoaderConfig overrides (`default`: none, so the script also measures an
older checkout of the loader: run this file with that checkout's datakit first on sys.path).
`--profile` records, with torch.profiler, the ops of every thread that run inside the training
thread's `next()` (workers 2, 30 ms steps): what the data wait is made of.
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from datakit import open_shards  # noqa: E402
from datakit.machine import available_cpus  # noqa: E402
from datakit.loader import LoaderConfig, Normaliser, ShardLoader  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402
from bench.record import header  # noqa: E402

SYNTH_CAMS = ("observation.images.top", "observation.images.wrist")
SYNTH_EPISODES = ((8, 40), (3, 40))  # (episodes, frames) of the two synthetic sources

# Pi0.5-shaped samples: the fields trainkit's pi05 loader preset sets (trainkit/models/pi05/batches.py)
PI05_SHAPE = {"frame_offsets": (0,), "action_horizon": 50, "norm": "quantile"}
# LoaderConfig overrides; `ring_off`: stage every batch into the pinned ring (the copy before)
VARIANTS = {"default": {}, "ring_off": {"register_ring": False}, "switch_0.5ms": {}}
# the interpreter's GIL switch interval during a variant's measurement (Python's default is 5 ms): the
# H100 profile of 2026-12-07 put most of next()'s wait in the training thread getting the GIL back from
# the feeder thread (bench/results/loader.md), which a shorter interval bounds
SWITCH_INTERVAL_S = {"switch_0.5ms": 0.0005}


def switch_interval(variant: str):
    """A context manager: `variant`'s GIL switch interval while it runs (none: the interpreter's)."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        before = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S.get(variant, before))
        try:
            yield
        finally:
            sys.setswitchinterval(before)

    return scope()


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
        norm = Normaliser.from_index(index, LoaderConfig(**PI05_SHAPE, image_dtype="bfloat16")).to("cuda")
        x = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")
        y = norm.images(x)
        assert y.shape == (32, 3, 1, 3, 224, 224) and y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
        out[layout] = {"ms": cuda_ms(lambda: norm.images(x)), "out_bytes": y.numel() * 2}
        if layout == "nv12":
            general = Normaliser.from_index(index, LoaderConfig(**PI05_SHAPE, image_dtype="bfloat16")).to("cuda")
            general.fused_nv12 = None
            g = general.images(x)
            out["nv12_general"] = {"ms": cuda_ms(lambda: general.images(x)), "out_bytes": g.numel() * 2,
                                   "max_abs_diff_vs_fused": float((g.float() - y.float()).abs().max())}
    return out


def make_step(target_ms: float):
    """A dummy training step: reads the images, then bf16 matmuls for about `target_ms`."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(200):  # ~0.3 s of the same GEMM first: a cold GPU's clocks made 30 ms steps run 28-37 ms
        a @ b
    one = cuda_ms(lambda: a @ b, reps=50)
    n = max(1, round(target_ms / one))

    def step(batch) -> float:
        acc = batch["images"].float().mean() + batch["action"].mean()
        c = a
        for _ in range(n):
            c = c @ b
            c = c * (1.0 / 64.0)  # keeps values finite
        return float((c[0, 0].float() + acc * 0).item())  # one sync per step, like logging the loss
    return step


def make_synth(root: Path) -> list[Path]:
    """The two synthetic sources (PNG image columns -> NV12 shards), made once under `root`."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    outs = []
    for k, (episodes, frames) in enumerate(SYNTH_EPISODES):
        out = root / f"source{k}-nv12"
        if not (out / "checksums.json").exists():
            src = make_lerobot_dataset(root / f"source{k}-src", version="v2.1", episode_lengths=(frames,) * episodes,
                                       height=224, width=224, cameras=(), image_cameras=SYNTH_CAMS, blank_cameras=(),
                                       seed=k)
            convert(src, out, ConvertConfig(layout="nv12", workers=min(4, available_cpus()), progress=False),
                    force=True)
        outs.append(out)
    return outs


def source_of(fixtures: list[Path], mixture: list[float] | None):
    """What ShardLoader reads: the first fixture, or the weighted mixture of all of them."""
    return fixtures[0] if mixture is None else {str(f): w for f, w in zip(fixtures, mixture)}


def slots_of(fixtures: list[Path]) -> tuple[str, ...]:
    return tuple(load_index(fixtures[0]).cameras)


def data_wait(fixtures: list[Path], workers: int, target_ms: float, steps: int, variant: str,
              mixture: list[float] | None = None) -> dict:
    with switch_interval(variant):
        return _data_wait(fixtures, workers, target_ms, steps, variant, mixture)


def profile_wait(fixtures: list[Path], variant: str, steps: int = 100) -> str:
    with switch_interval(variant):
        return _profile_wait(fixtures, variant, steps)


def throughput(fixtures: list[Path], workers: int, batches: int, variant: str) -> dict:
    with switch_interval(variant):
        return _throughput(fixtures, workers, batches, variant)


def _data_wait(fixtures: list[Path], workers: int, target_ms: float, steps: int, variant: str,
              mixture: list[float] | None = None) -> dict:
    step = make_step(target_ms)
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=workers, slots=slots_of(fixtures), prefetch_factor=4,
                       **VARIANTS[variant])
    loader = ShardLoader(source_of(fixtures, mixture), cfg)
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
    waits_ms = sorted(1e3 * w for w in waits)
    return {"variant": variant, "source": "one" if mixture is None else "mixture " + "/".join(f"{w:g}" for w in mixture),
            "workers": workers, "target_step_ms": target_ms, "steps": steps,
            "step_ms_median": 1e3 * statistics.median(totals), "wait_ms_median": statistics.median(waits_ms),
            "wait_ms_p90": waits_ms[int(0.9 * len(waits_ms))], "wait_ms_max": waits_ms[-1],
            "wait_fraction": sum(waits) / sum(totals), "kept_slots": int(batch["images"].shape[1])}


def _profile_wait(fixtures: list[Path], variant: str, steps: int = 100) -> str:
    """What the training thread's `next()` is made of (workers 2, 30 ms steps): perf_counter
    around the parts it calls - the queue of finished batches, a stream's wait on the batch's
    event, the loader's bookkeeping (`_delivered` in older checkouts, `_took` now) - the garbage
    collector's passes inside it, and the rest (generator hops, the GIL held by another thread).
    Beside it, how long the feeder thread works per batch (the host stream's `next()`, and the
    launch where the loader has one) and how much of that falls inside the training thread's
    `next()` windows."""
    import gc
    from datakit.loader import gpu_batch, loader as loader_mod

    main = threading.get_ident()
    parts: dict[str, float] = {}
    feeder: list[tuple[str, float, float]] = []  # (what, start, end) in the feeder thread
    state = {"in_next": False, "gc_t0": 0.0}

    def timed(name, fn):
        def wrapper(*a, **kw):
            if threading.get_ident() != main:
                return fn(*a, **kw)
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    def feeder_timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if threading.get_ident() != main:
                    feeder.append((name, t, time.perf_counter()))
        return wrapper

    def on_gc(phase, info):
        if threading.get_ident() == main and state["in_next"]:
            if phase == "start":
                state["gc_t0"] = time.perf_counter()
            else:
                parts["gc"] = parts.get("gc", 0.0) + time.perf_counter() - state["gc_t0"]

    class TimedQueue(queue.Queue):
        get = timed("ready.get", queue.Queue.get)

    class TimedSimpleQueue(queue.SimpleQueue):
        get = timed("ready.get", queue.SimpleQueue.get)

    def timed_stream(orig):
        def _stream(self, *a, **kw):
            it = orig(self, *a, **kw)
            nxt = feeder_timed("host next()", lambda: next(it, None))
            while (b := nxt()) is not None:
                yield b
        return _stream

    Loader, Batcher = loader_mod.ShardLoader, gpu_batch.DeviceBatcher
    books = [n for n in ("_delivered", "_took") if hasattr(Loader, n)]
    saved = [(gpu_batch, "queue", gpu_batch.queue), (torch.cuda.Stream, "wait_event", torch.cuda.Stream.wait_event),
             (torch.cuda, "current_stream", torch.cuda.current_stream),
             (Loader, "_stream", Loader._stream), *[(Loader, n, getattr(Loader, n)) for n in books]]
    if hasattr(torch._C, "_cuda_getCurrentRawStream"):  # the per-batch stream check since issue 27
        saved.append((torch._C, "_cuda_getCurrentRawStream", torch._C._cuda_getCurrentRawStream))
        torch._C._cuda_getCurrentRawStream = timed("cuda raw stream", torch._C._cuda_getCurrentRawStream)
    if hasattr(Batcher, "_launch"):
        saved.append((Batcher, "_launch", Batcher._launch))
        Batcher._launch = feeder_timed("launch", Batcher._launch)
    gpu_batch.queue = types.SimpleNamespace(Queue=TimedQueue, SimpleQueue=TimedSimpleQueue)
    torch.cuda.Stream.wait_event = timed("stream.wait_event", torch.cuda.Stream.wait_event)
    torch.cuda.current_stream = timed("cuda.current_stream", torch.cuda.current_stream)
    Loader._stream = timed_stream(Loader._stream)
    for n in books:
        setattr(Loader, n, timed(f"ShardLoader.{n}", getattr(Loader, n)))
    gc.callbacks.append(on_gc)
    try:
        step = make_step(30.0)
        cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=2, slots=slots_of(fixtures), prefetch_factor=4,
                           **VARIANTS[variant])
        it = ShardLoader(fixtures[0], cfg).device_batches("cuda")
        for _ in range(5):
            step(next(it))
        rows, windows = [], []
        for _ in range(steps):
            parts.clear()
            state["in_next"] = True
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            state["in_next"] = False
            step(batch)
            rows.append({**parts, "total": t1 - t0})
            windows.append((t0, t1))
    finally:
        gc.callbacks.remove(on_gc)
        for obj, name, val in saved:
            setattr(obj, name, val)
    names = ["total", "ready.get", "stream.wait_event", "cuda.current_stream", "cuda raw stream",
             *[f"ShardLoader.{n}" for n in books],
             "gc"]
    lines = [f"variant {variant}: next() of the training thread, workers 2, 30 ms steps, {steps} steps (ms)",
             f"  {'part':<24} {'median':>8} {'mean':>8} {'p90':>8} {'max':>8}"]

    def stats(name, vals):
        ms = sorted(1e3 * v for v in vals)
        lines.append(f"  {name:<24} {statistics.median(ms):8.3f} {statistics.fmean(ms):8.3f} "
                     f"{ms[int(0.9 * len(ms))]:8.3f} {ms[-1]:8.3f}")
    for name in names:
        stats(name, [r.get(name, 0.0) for r in rows])
    stats("rest", [r["total"] - sum(r.get(n, 0.0) for n in names[1:]) for r in rows])
    lines.append("  feeder thread, per batch:")
    for what in sorted({w for w, _, _ in feeder}):
        stats(what, [b - a for w, a, b in feeder if w == what])
    overlap = [sum(max(0.0, min(b, w1) - max(a, w0)) for _, a, b in feeder) for w0, w1 in windows]
    stats("feeder busy in next()", overlap)
    lines.append(f"  next() windows with the feeder busy: {sum(o > 0 for o in overlap)} of {len(windows)}")
    return "\n".join(lines)


def _throughput(fixtures: list[Path], workers: int, batches: int, variant: str) -> dict:
    """Device batches per second with no consumer: the loader's own ceiling on this machine."""
    fixture = fixtures[0]
    cfg = LoaderConfig(**PI05_SHAPE, batch_size=32, num_workers=workers, slots=slots_of(fixtures), prefetch_factor=4,
                       **VARIANTS[variant])
    it = ShardLoader(fixture, cfg).device_batches("cuda")
    for _ in range(5):
        next(it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        b = next(it)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    # host bytes per sample: the slots kept in the batch x the stored frame size from the index
    frame_bytes = open_shards(fixture).index.cameras[slots_of(fixtures)[0]].frame_bytes
    kept = int(b["images"].shape[1])
    return {"variant": variant, "workers": workers, "items_per_s": batches * 32 / dt,
            "image_bytes_per_s_host": batches * 32 * kept * frame_bytes / dt}


def compare(paths: list[Path]) -> str:
    """The data-wait rows of several result files side by side (label = file stem)."""
    lines = ["| step | workers | loader | wait median | wait p90 | wait max | wait / step time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    rows = [(p.stem, r) for p in paths for r in json.loads(p.read_text())["data_wait"]]
    for label, r in sorted(rows, key=lambda x: (-x[1]["target_step_ms"], x[1]["workers"])):
        source = "" if r.get("source", "one") == "one" else f", {r['source']}"
        lines.append(f"| {r['target_step_ms']:.0f} ms | {r['workers']} | {label} {r.get('variant', 'default')}{source} | "
                     f"{r['wait_ms_median']:.3f} ms | {r.get('wait_ms_p90', float('nan')):.3f} ms | "
                     f"{r['wait_ms_max']:.2f} ms | {100 * r['wait_fraction']:.2f}% |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fx = p.add_mutually_exclusive_group()
    fx.add_argument("--fixtures", type=Path, nargs="+", help="shard folders (the first is the single source)")
    fx.add_argument("--synth", type=Path, help="make (or reuse) the two synthetic sources here, no video decoder needed")
    p.add_argument("--mixture", type=float, nargs="+", default=None,
                   help="weights, one per fixture: also measure the data wait of their mixture")
    p.add_argument("--out", type=Path)
    p.add_argument("--parts", nargs="+", default=["h2d", "normalise", "throughput", "wait"],
                   choices=["h2d", "normalise", "throughput", "wait"])
    p.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS))
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--step-ms", type=float, nargs="+", default=[100.0, 30.0, 15.0])
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per data-wait setting (at least 40 steps)")
    p.add_argument("--profile", type=Path, default=None, help="write the next() profile of each variant here")
    p.add_argument("--compare", type=Path, nargs="+", default=None, help="print the data-wait table of these files")
    args = p.parse_args()
    if args.compare:
        return print(compare(args.compare))
    assert torch.cuda.is_available(), "needs CUDA"
    fixtures = make_synth(args.synth) if args.synth else args.fixtures
    if args.mixture is not None and len(args.mixture) != len(fixtures):
        p.error(f"--mixture has {len(args.mixture)} weights for {len(fixtures)} fixtures")
    res = {**header(), "cpus": available_cpus(), "loadavg": [float(x) for x in open("/proc/loadavg").read().split()[:3]]}
    if "h2d" in args.parts:
        res["h2d"] = h2d({
            "uint8_pruned_2slots": ((32, 2, 1, 224, 224, 3), torch.uint8),
            "uint8_all_3slots": ((32, 3, 1, 224, 224, 3), torch.uint8),
            "nv12_pruned_2slots": ((32, 2, 1, 336, 224), torch.uint8),
            "float32_all_3slots": ((32, 3, 1, 3, 224, 224), torch.float32),
        })
    if "normalise" in args.parts:
        res["normalise"] = normalise_timing(load_index(fixtures[0]))
    if "throughput" in args.parts:
        res["throughput"] = [throughput(fixtures, w, 60, v) for v in args.variants for w in args.workers]
    if "wait" in args.parts:
        res["fixtures"] = [str(f) for f in fixtures]
        res["data_wait"] = [data_wait(fixtures, w, ms, max(40, round(1e3 * args.seconds / ms)), v)
                            for v in args.variants for ms in args.step_ms for w in args.workers]
        if args.mixture is not None:
            try:
                res["data_wait"] += [data_wait(fixtures, w, ms, max(40, round(1e3 * args.seconds / ms)), v,
                                               args.mixture)
                                     for v in args.variants for ms in args.step_ms for w in args.workers]
            except Exception as e:  # a loader that reads one source: say so, keep the single-source rows
                res["mixture_error"] = f"{type(e).__name__}: {e}"
    if args.profile is not None:
        args.profile.write_text("\n\n".join(profile_wait(fixtures, v) for v in args.variants) + "\n")
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

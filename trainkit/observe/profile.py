"""A torch.profiler window over a few steady-state steps, reduced to where the time went.

With `output.profile_steps = n`, steps WARMUP .. WARMUP + n of a run are profiled (after
compilation and allocator warm-up), and each rank's GPU timeline is reduced to four numbers over
the window's wall time:
- compute: time some non-communication kernel runs (union over streams);
- exposed communication: time an NCCL kernel runs and no compute kernel does;
- copies: memcpy/memset time not under compute (H2D the loader did not hide);
- idle: time no kernel runs at all (launch gaps, host-side waits including data wait).
They add up to the window. Kernel time is also split by kind (summed durations, overlaps counted
twice): matmul (cuBLAS/CUTLASS GEMMs), attention (flash / memory-efficient / cuDNN SDPA
kernels), triton (torch.compile's fused elementwise and reduction kernels), nccl, copy, and
other (eager elementwise, norms, reductions), and the top kernels by summed time. What the host
was doing while the GPU sat idle: each host-side event (the trainer's phases, `trainkit.*`, the
aten ops and CUDA runtime calls under them) with the idle time it overlaps, so a sync (`aten::item`,
`cudaStreamSynchronize`) or a slow phase (`trainkit.next_batch`) behind the idle shows by name.
The summary goes to `profile_rank{r}.json` in the run folder and
into the run's result; no trace file is kept (a 3B-model trace is hundreds of MB).
"""
from __future__ import annotations

import bisect
import json
import time
from pathlib import Path
from typing import Any

import torch

WARMUP = 5  # steps after the start of a run before the window opens


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of union a not covered by union b (both sorted, disjoint)."""
    total, j = 0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


KINDS = (("nccl", ("nccl",)), ("copy", ("memcpy", "memset")),
         ("attention", ("flash", "fmha", "attention", "efficient", "cudnn")), ("triton", ("triton",)),
         ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90", "sm80")))


def kernel_kind(name: str) -> str:
    """The kind of a GPU activity by its name (first match in KINDS), else "other"."""
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


GEMM_OPS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}  # op -> positions of the (M, K) and (K, N) inputs


def gemm_table(prof: Any, per: int = 1, n: int = 20, device: bool = True) -> list[dict[str, Any]]:
    """GEMMs by shape (needs `record_shapes=True`): summed GPU ms per step (host ms with
    `device=False`), calls and the achieved TFLOP/s, largest total first, so a shape that runs far
    below the others shows."""
    rows = []
    for evt in prof.key_averages(group_by_input_shape=True):
        if evt.key not in GEMM_OPS or not evt.input_shapes:
            continue
        a, b = GEMM_OPS[evt.key]
        shapes = evt.input_shapes
        if len(shapes) <= b or len(shapes[a]) != 2 or len(shapes[b]) != 2:
            continue
        (m, k), (_, nn) = shapes[a], shapes[b]
        us = getattr(evt, "device_time_total", getattr(evt, "cuda_time_total", 0.0)) if device else evt.cpu_time_total
        ms = us / 1e3
        if ms <= 0:
            continue
        rows.append({"op": evt.key, "m": m, "n": nn, "k": k, "ms": round(ms / per, 3), "calls": round(evt.count / per, 1),
                     "tflops": round(2 * m * nn * k * evt.count / (ms / 1e3) / 1e12, 1)})
    return sorted(rows, key=lambda r: -r["ms"])[:n]


def gpu_kernels(prof: Any) -> list[tuple[str, int, int]]:
    """(name, start_ns, duration_ns) of every GPU activity of a finished profile, without the
    user annotations (FSDP::all_gather, Optimizer.step, nccl:...) that span kernels and would
    count their time twice."""
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(e, "is_user_annotation", lambda: False)():
            continue
        out.append((e.name(), e.start_ns(), e.duration_ns()))
    return out


def top_kernels(kernels: list[tuple[str, int, int]], n: int = 25, per: int = 1) -> list[dict[str, Any]]:
    """The `n` kernels with the most summed time (ms and launches divided by `per` steps), so a
    profile says which GEMM, elementwise or copy kernel holds the time, not only its kind."""
    total: dict[str, list[float]] = {}
    for name, _, d in kernels:
        t = total.setdefault(name, [0.0, 0])
        t[0] += d * 1e-6
        t[1] += 1
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name[:160], "kind": kernel_kind(name), "ms": round(ms / per, 3), "calls": round(c / per, 1)}
            for name, (ms, c) in rows]


def host_events(prof: Any) -> list[tuple[str, int, int]]:
    """(name, start_ns, duration_ns) of every host-side event of a finished profile (ops, runtime
    calls and record_function annotations, nested ones each on their own)."""
    return [(e.name(), e.start_ns(), e.duration_ns()) for e in prof.profiler.kineto_results.events()
            if e.device_type() == torch.autograd.DeviceType.CPU]


def idle_gaps(kernels: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """The intervals between the first GPU activity's start and the last one's end where none runs."""
    busy = _union([(s, s + d) for _, s, d in kernels])
    return [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] > a[1]]


def idle_by_host(host: list[tuple[str, int, int]], gaps: list[tuple[int, int]], n: int = 15,
                 per: int = 1) -> list[dict[str, Any]]:
    """Host events by the GPU idle time they overlap (ms per step, `per` steps), most first: nested
    events each count their own overlap (a phase and the sync inside it both show), so read the rows
    as a call chain, not as parts of a sum. `gaps`: sorted, disjoint (`idle_gaps`)."""
    starts = [g[0] for g in gaps]
    total: dict[str, list[float]] = {}
    for name, s, d in host:
        e, i = s + d, max(0, bisect.bisect_right(starts, s) - 1)
        over = 0
        while i < len(gaps) and gaps[i][0] < e:
            over += max(0, min(e, gaps[i][1]) - max(s, gaps[i][0]))
            i += 1
        if over:
            t = total.setdefault(name, [0.0, 0])
            t[0] += over * 1e-6
            t[1] += 1
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name[:160], "idle_ms": round(ms / per, 3), "calls": round(c / per, 1)} for name, (ms, c) in rows]


def timeline_summary(kernels: list[tuple[str, int, int]], wall_ns: int) -> dict[str, float]:
    """Reduce (name, start_ns, duration_ns) GPU activities over a window of `wall_ns`."""
    comm = _union([(s, s + d) for n, s, d in kernels if "nccl" in n.lower()])
    copy = _union([(s, s + d) for n, s, d in kernels if n.lower().startswith(("memcpy", "memset"))])
    comp = _union([(s, s + d) for n, s, d in kernels
                   if "nccl" not in n.lower() and not n.lower().startswith(("memcpy", "memset"))])
    busy = _union(comm + copy + comp)
    ms = 1e-6
    kinds = {f"kernel_{k}_ms": 0.0 for k, _ in KINDS} | {"kernel_other_ms": 0.0}
    for n, _, d in kernels:
        kinds[f"kernel_{kernel_kind(n)}_ms"] += d * ms
    return kinds | {"window_ms": wall_ns * ms, "compute_ms": _length(comp) * ms,
            "exposed_comm_ms": _minus(comm, comp) * ms, "comm_total_ms": _length(comm) * ms,
            "exposed_copy_ms": _minus(copy, _union(comp + comm)) * ms,
            "idle_ms": max(0, wall_ns - _length(busy)) * ms}


class StepProfiler:
    """Opens the profiler before relative step WARMUP, closes it after WARMUP + n - 1."""

    def __init__(self, out_dir: Path, steps: int, device: torch.device, rank: int):
        self.out_dir, self.steps, self.device, self.rank = Path(out_dir), steps, device, rank
        self.summary: dict[str, Any] = {}
        self._prof = None
        self._t0 = 0.0

    def before_step(self, i: int) -> None:
        if self.steps and i == WARMUP:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=acts, record_shapes=True)
            self._prof.__enter__()
            self._t0 = time.perf_counter()

    def after_step(self, i: int) -> None:
        if self._prof is None or i != WARMUP + self.steps - 1:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall_ns = int((time.perf_counter() - self._t0) * 1e9)
        self._prof.__exit__(None, None, None)
        kernels = gpu_kernels(self._prof)
        s = timeline_summary(kernels, wall_ns)
        self.summary = {k: v / self.steps for k, v in s.items()} | {"steps": self.steps, "per": "step",
                                                                      "top_kernels": top_kernels(kernels, per=self.steps),
                                                                      "idle_by_host": idle_by_host(host_events(self._prof), idle_gaps(kernels),
                                                                                                   per=self.steps),
                                                                      "gemms": gemm_table(self._prof, per=self.steps)}
        self._prof = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # ranks reduce their traces at different speeds: meet here, so the slower rank's
            # reduction is not charged to the other's next metric interval
            torch.distributed.barrier()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"profile_rank{self.rank}.json").write_text(json.dumps(self.summary, indent=1) + "\n")

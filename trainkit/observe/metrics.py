"""Training metrics: per step (loss, grad norm, lr, data wait) and per log interval (step time,
samples/s per GPU, tokens/s, MFU, peak memory, data-wait share, all-gathers per step).

Nothing here synchronises the GPU except `flush()`, called every `log_every` steps: losses
and grad norms stay device tensors until then, and the interval's step time is the wall time
between two flushes (each ends with a device synchronise) over the steps in between, so the
CPU can run ahead of the GPU as it does in training.

MFU = analytic model FLOPs of the samples (`flops_per_sample(cfg, slots)`, forward + backward,
recompute not counted, at the slots each batch actually carried) / step time / the device's dense
bf16 peak (`peak_flops`: 989e12 on an H100 or H200), per GPU; None (printed "n/a") on a device
with no listed peak, a CPU among them. All-gathers are counted as they happen (`CollectiveCounter` wraps
torch.distributed's all-gather entry points, which FSDP2 calls), not derived from the config.

Output: `metrics.jsonl` in the run folder (rank 0), one JSON object a line; a terminal line per
interval and a progress bar (tqdm, on a terminal) on rank 0; the same rows to TensorBoard or wandb with
`output.tracker` (trackers.py). `"step"` in metrics.jsonl is the 0-based index of the step (the
keys of `losses` and of tests/assets too); the terminal says steps done, `step 10/40` after the
10th step, as the checkpoint it may write is named (`step-000010`), and so do the trackers.
The file holds each step once: a run that resumes at step k (from a checkpoint older than the
last logged step, or a crash after it) first drops the rows of steps >= k and any line a kill cut
short (`keep_rows_before`), then appends; a fresh run (k = 0) starts it empty.
- `"kind": "step"`: step, loss (mean over the global batch: ranks and micro-batches), grad_norm (global),
  lr, data_wait_s (host time blocked on the loader), image_slots (slots the batch carried).
- `"kind": "interval"`: step (last of the interval), steps, step_time_s, samples_per_s_gpu,
  tokens_per_s_gpu (image + text + action tokens), model_flops_per_s_gpu (the analytic count, on any
  device), mfu (fraction, or null), peak_flops (the peak MFU is
  measured against, or null), peak_mem_gib (max allocated since start; null off CUDA, where the
  allocator keeps no count), data_wait_s (per step), data_wait_frac (of wall time), all_gathers_per_step (counted),
  loss, image_slots; with a mixture (data.sources) `loss/<source name>`: the mean per-item loss of the
  source's samples in the interval, over all ranks, and `samples/<source name>`: their count (source_loss.py).
- `"kind": "eval"`: step (the last trained), val_loss (trainkit/validation.py), val_loss_ema (with
  train.ema_decay), samples (over all ranks); a mixture also `val_loss/<source name>` (and
  `val_loss_ema/<source name>`) per validated source, val_loss their weight-weighted mean
  (validation.MixtureValidation); its wall time is left out of the interval's step time.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.distributed as dist

from datakit.durable import write_atomic
from trainkit.observe.trackers import Tracker

# Dense bf16 tensor-core peak per GPU, by a part of the device name (H100 SXM = H200 = 989 TFLOP/s;
# A100 312 TFLOP/s): MFU is measured against it, and is n/a on any other device.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
NO_PEAK = "n/a (no peak for this device)"


def peak_flops(device: torch.device) -> float | None:
    """The dense bf16 peak of `device` (FLOP/s), or None for a CPU or an unlisted GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def format_mfu(mfu: float | None) -> str:
    return NO_PEAK if mfu is None else f"{100 * mfu:.1f}%"


def format_mem(gib: float | None) -> str:
    return "n/a (measured on CUDA only)" if gib is None else f"{gib:.1f} GiB"


def keep_rows_before(path: Path, step: int) -> None:
    """Rewrite `path` (atomically) without the rows of steps >= `step` and without lines that are
    not JSON (the last one, cut by a kill -9): a run resuming at `step` logs those steps again, so
    the file keeps each step once, as the run's history now is. Rows without a step are kept."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.decode("utf-8", errors="replace").splitlines()
    kept = [line for line in lines if _before(line, step)]
    if len(kept) < len(lines) or data and not data.endswith(b"\n"):
        write_atomic(path, "".join(f"{line}\n" for line in kept).encode())


def _before(line: str, step: int) -> bool:
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return not isinstance(row, dict) or not isinstance(row.get("step"), int) or row["step"] < step


class CollectiveCounter:
    """Counts all-gathers issued through torch.distributed while installed (FSDP2 calls
    `all_gather_into_tensor` or, in newer releases, `all_gather_single`)."""

    NAMES = ("all_gather_into_tensor", "all_gather_single")

    def __init__(self) -> None:
        self.count = 0
        self._saved: dict[str, Callable] = {}

    def install(self) -> "CollectiveCounter":
        for name in self.NAMES:
            fn = getattr(dist, name, None)
            if fn is None or name in self._saved:
                continue
            self._saved[name] = fn

            def counted(*args: Any, __fn: Callable = fn, **kw: Any) -> Any:
                self.count += 1
                return __fn(*args, **kw)

            setattr(dist, name, counted)
        return self

    def uninstall(self) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()


@dataclass
class StepRecord:
    step: int
    loss: torch.Tensor  # device scalars until flush
    grad_norm: torch.Tensor
    lr: float
    data_wait_s: float
    samples: int  # on this rank
    flops: float  # model FLOPs of this rank's samples
    tokens: int  # sequence tokens of this rank's samples (image + text + action)
    image_slots: int  # slots carried by the last micro-batch


@dataclass
class Metrics:
    """Collects step records; `flush()` writes them and the interval summary."""

    out_dir: Path
    rank: int
    total_steps: int
    device: torch.device
    progress: bool = True
    counter: CollectiveCounter | None = None
    first_step: int = 0  # the step this run starts at (a resume's): metrics.jsonl keeps the rows before it
    tracker: Tracker | None = None  # rank 0's TensorBoard / wandb (trackers.open_tracker), sent every row written
    records: list[StepRecord] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # every interval summary (bench reads it)
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (tests read it)
    evals: list[dict[str, Any]] = field(default_factory=list)  # every validation record (summary.json)

    def __post_init__(self) -> None:
        self._peak = peak_flops(self.device)
        self._t0 = time.perf_counter()
        self._gathers0 = self.counter.count if self.counter else 0
        self._bar = None
        if self.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            keep_rows_before(self.out_dir / "metrics.jsonl", self.first_step)
            self._jsonl = open(self.out_dir / "metrics.jsonl", "a")
            if self.progress and sys.stderr.isatty():  # in a log its \r redraws pile up; the step lines say it
                from tqdm import tqdm
                self._bar = tqdm(total=self.total_steps, unit="step", dynamic_ncols=True, file=sys.stderr)

    def start(self, step: int) -> None:
        """Start timing at `step` (after a resume, or after warm-up steps to leave out)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._t0 = time.perf_counter()
        self._gathers0 = self.counter.count if self.counter else 0
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()

    def record(self, rec: StepRecord) -> None:
        self.records.append(rec)
        if self._bar is not None:
            self._bar.update(1)

    def discard(self, step: int) -> None:
        """Drop step `step`'s record, not yet flushed (a deferred non-finite check skipped it)."""
        self.records = [r for r in self.records if r.step != step]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the block's wall time (a validation pass) out of the current interval's step time."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self._t0 += time.perf_counter() - t

    def log_eval(self, rec: dict[str, Any]) -> None:
        """A validation record ({"step", "val_loss", ...}): a metrics.jsonl line and a terminal line."""
        rec = {"kind": "eval", **rec}
        self.evals.append(rec)
        if self.rank != 0:
            return
        self._jsonl.write(json.dumps(rec) + "\n")
        self._jsonl.flush()
        if self.tracker is not None:
            self.tracker.log([rec])
        line = f"eval {self._steps_done(rec['step'])} | " + " | ".join(
            f"{k.replace('_', ' ')} {v:.4f}" for k, v in rec.items() if k.startswith("val_loss"))
        (self._bar.write if self._bar is not None else print)(line)

    def flush(self, per_source: dict[str, float] | None = None) -> dict[str, Any] | None:
        """Synchronise once, write the interval's step records and summary (with `per_source`, the
        interval's `loss/<name>` figures: SourceLoss.reduce); returns the summary."""
        if not self.records:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        recs, self.records = self.records, []
        n, dt = len(recs), now - self._t0
        losses = torch.stack([r.loss.detach().float() for r in recs]).cpu().tolist()
        norms = torch.stack([r.grad_norm.detach().float() for r in recs]).cpu().tolist()
        gathers = (self.counter.count - self._gathers0) if self.counter else 0
        step_s = dt / n
        wait = sum(r.data_wait_s for r in recs)
        summary = {
            "kind": "interval", "step": recs[-1].step, "steps": n, "step_time_s": step_s,
            "samples_per_s_gpu": sum(r.samples for r in recs) / dt,
            "tokens_per_s_gpu": sum(r.tokens for r in recs) / dt,
            "model_flops_per_s_gpu": sum(r.flops for r in recs) / dt,
            "mfu": None if self._peak is None else sum(r.flops for r in recs) / dt / self._peak,
            "peak_flops": self._peak,
            "peak_mem_gib": (torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda"
                             else None),
            # what the card holds: a CUDA graph's private pool is reserved, not allocated, between replays,
            # so a graphed run's allocated peak understates its footprint
            "peak_reserved_gib": (torch.cuda.max_memory_reserved(self.device) / 2**30 if self.device.type == "cuda"
                                  else None),
            "data_wait_s": wait / n, "data_wait_frac": wait / dt, "all_gathers_per_step": gathers / n,
            "loss": losses[-1], "image_slots": recs[-1].image_slots, **(per_source or {}),
        }
        self.history.append(summary)
        for r, loss, gn in zip(recs, losses, norms):
            self.losses[r.step] = loss
        if self.rank == 0:
            rows = [{"kind": "step", "step": r.step, "loss": loss, "grad_norm": gn, "lr": r.lr,
                     "data_wait_s": r.data_wait_s, "image_slots": r.image_slots}
                    for r, loss, gn in zip(recs, losses, norms)] + [summary]
            self._jsonl.write("".join(json.dumps(row) + "\n" for row in rows))
            self._jsonl.flush()
            if self.tracker is not None:
                self.tracker.log(rows)
            line = (f"step {self._steps_done(summary['step'])} | loss {losses[-1]:.4f} | gnorm {norms[-1]:.3f} | "
                    f"{step_s * 1e3:.0f} ms/step | {summary['samples_per_s_gpu']:.1f} samples/s/GPU | "
                    f"MFU {format_mfu(summary['mfu'])} | mem {format_mem(summary['peak_mem_gib'])} | "
                    f"wait {100 * summary['data_wait_frac']:.1f}% | AG/step {summary['all_gathers_per_step']:.0f}"
                    + "".join(f" | {k} {v:.4f}" for k, v in (per_source or {}).items() if k.startswith("loss/")))
            (self._bar.write if self._bar is not None else print)(line)
        self._t0 = time.perf_counter()
        self._gathers0 = self.counter.count if self.counter else 0
        return summary

    def _steps_done(self, step: int) -> str:
        """`10/40` after the step of 0-based index 9: the count a checkpoint saved now is named by."""
        return f"{step + 1:>{len(str(self.total_steps))}}/{self.total_steps}"

    def close(self) -> None:
        self.flush()
        if self.rank == 0:
            if self._bar is not None:
                self._bar.close()
            self._jsonl.close()
            if self.tracker is not None:
                self.tracker.close()

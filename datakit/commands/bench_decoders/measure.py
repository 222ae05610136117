"""What one measurement is (`Job`), and the timing loop that runs inside a measured process.

The loop times only the decoder calls: opening (when the decoder is reopened per sample),
`read_range` chunks and `get_frames`. Checking frames, which costs a barcode read per frame,
happens between timed sections, so a correct decoder is not charged for being verified. CPU
time is the process's (all threads: FFmpeg's frame threads count), taken around the same
sections, so CPU ms per frame shows what a decoder costs the other workers of a data loader.

The loop takes the decoder opener as an argument, so tests can feed it a deliberately wrong
decoder and see the wrong frames reported.
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from datakit.commands.bench_decoders.patterns import Read, get_pattern
from datakit.commands.bench_decoders.videos import BenchVideo

Opener = Callable[[Path], Any]  # path -> decoder with read_range / get_frames / close
CHUNK = 16  # frames per read_range chunk, as conversion uses
MAX_EXAMPLES = 5


@dataclass(frozen=True, kw_only=True)
class Setting:
    threads: int = 1  # decoder threads; 0 = the library's own choice
    seek_mode: str = "exact"  # TorchCodec only: "exact" scans the file, "approximate" trusts headers
    reuse: bool = True  # one decoder per file for all samples, or reopened for every sample
    workers: int = 1  # processes decoding at once (a data loader's num_workers)


@dataclass(frozen=True, kw_only=True)
class Job:
    backend: str  # "pyav" | "decord" | "torchcodec" | "torchcodec-cuda" | "module:opener"
    video: BenchVideo
    pattern: str
    setting: Setting = field(default_factory=Setting)
    group: str = "main"  # which part of the matrix asked for it: main, threads, seek, reuse, workers
    repeats: int = 5  # timed repeats at most (a warm-up repeat comes first and is not counted)
    min_repeats: int = 2  # timed repeats at least, even past max_s
    max_s: float = 8.0  # stop adding repeats once this much decode time is spent
    seed: int = 0
    probe_out: str | None = None  # where to save a few decoded frames for the cross-backend PSNR
    block_modules: tuple[str, ...] = ()  # modules made unimportable in the measured process

    def to_json(self) -> dict:
        d = asdict(self)
        d["video"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in d["video"].items()}
        d["video"]["views"] = [str(p) for p in self.video.views]
        return d

    @staticmethod
    def from_json(d: dict) -> "Job":
        v = dict(d["video"])
        v["path"] = Path(v["path"])
        v["views"] = tuple(Path(p) for p in v["views"])
        return Job(**{**d, "video": BenchVideo(**v), "setting": Setting(**d["setting"]),
                      "block_modules": tuple(d.get("block_modules", ()))})


class _Clock:
    """Accumulates wall and process CPU time over the decoder calls only."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def __enter__(self) -> "_Clock":
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


@dataclass
class _Check:
    """Counts frames that are the frame asked for; without a barcode only the shape is checked."""

    numbered: bool
    shape: tuple[int, int]
    checked: int = 0
    correct: int = 0
    examples: list[list[int]] = field(default_factory=list)

    def __call__(self, frames: np.ndarray, asked: tuple[int, ...]) -> None:
        from datakit.synth.video import read_frame_number

        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[1:3] != self.shape or len(frames) != len(asked):
            self._wrong(asked[0] if asked else -1, -2, len(asked) or 1)
            return
        for img, want in zip(frames, asked):
            self.checked += 1
            if not self.numbered:
                self.correct += 1
                continue
            got = read_frame_number(img)
            if got == want % 65536:
                self.correct += 1
            elif len(self.examples) < MAX_EXAMPLES:
                self.examples.append([int(want), int(got)])

    def _wrong(self, want: int, got: int, n: int) -> None:
        self.checked += n
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append([int(want), int(got)])


def _rss_mb() -> float:
    """Peak resident memory of this process. VmHWM, not ru_maxrss: Linux carries ru_maxrss over
    from the parent across fork+exec, so a worker started by a big parent would report its size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _run_reads(reads: list[Read], video: BenchVideo, open_fn: Opener, decoders: dict[int, Any] | None,
               clock: _Clock, check: _Check, keep: dict[int, np.ndarray] | None = None,
               first: list[float] | None = None) -> int:
    """Perform the reads; returns frames delivered. `first` gets the wall time of the first
    frame (for time-to-first-frame); `keep` collects frames by index (for PSNR)."""
    delivered = 0
    for r in reads:
        if decoders is None:
            with clock:
                dec = open_fn(video.views[r.view] if video.views else video.path)
        else:
            dec = decoders[r.view]
        if r.contiguous:
            it = dec.read_range(r.indices[0], r.indices[-1] + 1, CHUNK)
            pos = 0
            while True:
                with clock:
                    arr = next(it, None)
                if arr is None:
                    break
                if first is not None and not first:
                    first.append(time.perf_counter())
                got = tuple(range(r.indices[0] + pos, r.indices[0] + pos + len(arr)))  # a range is consecutive
                check(arr, got)
                if keep is not None:
                    for j, i in enumerate(got):
                        if i in keep:
                            keep[i] = np.array(arr[j])
                pos += len(arr)
            if pos < len(r.indices):  # the decoder stopped early: the rest are wrong (missing)
                check._wrong(r.indices[pos], -1, len(r.indices) - pos)
            delivered += pos
        else:
            with clock:
                arr = dec.get_frames(list(r.indices))
            if first is not None and not first:
                first.append(time.perf_counter())
            check(arr, r.indices)
            delivered += len(arr)
        if decoders is None:
            with clock:
                dec.close()
    return delivered


def measure(job: Job, open_fn: Opener, ready: Callable[[], None] | None = None) -> dict:
    """Warm up, call `ready()` (the multi-worker start barrier), then time repeats.
    Returns per-repeat wall/CPU/frames plus checks, peak RSS and time to first frame."""
    pattern = get_pattern(job.pattern)
    video = job.video
    views = video.views or (video.path,)
    check = _Check(video.numbered, (video.height, video.width))
    n_views = max(r.view for r in pattern.reads(video.num_frames, 0)) + 1
    t0 = time.perf_counter()
    warm = _Clock()
    decoders = None
    if job.setting.reuse:
        with warm:
            decoders = {v: open_fn(views[v % len(views)]) for v in range(n_views)}
    first: list[float] = []
    _run_reads(pattern.reads(video.num_frames, job.seed * 1000 - 1), video, open_fn, decoders, warm, check,
               first=first)
    first_frame_ms = ((first[0] if first else time.perf_counter()) - t0) * 1e3
    if ready:
        ready()
    walls, cpus, frames = [], [], []
    keep: dict[int, np.ndarray] | None = None
    n = video.num_frames
    spent = 0.0
    for rep in range(job.repeats):
        if rep >= job.min_repeats and spent > job.max_s:
            break
        if job.probe_out and rep == 0:
            keep = {i: None for i in sorted({0, n // 3, (2 * n) // 3, n - 1})}
        clock = _Clock()
        got = _run_reads(pattern.reads(n, job.seed * 1000 + rep), video, open_fn, decoders, clock, check,
                         keep=keep if rep == 0 else None)
        walls.append(clock.wall)
        cpus.append(clock.cpu)
        frames.append(got)
        spent += clock.wall
    if decoders:
        for d in decoders.values():
            d.close()
    if job.probe_out and keep and all(v is not None for v in keep.values()):
        np.savez(job.probe_out, **{str(i): a for i, a in keep.items()})
    return {
        "walls": walls, "cpus": cpus, "frames": frames,
        "frames_checked": check.checked, "frames_correct": check.correct,
        "check": "barcode" if video.numbered else "shape",
        "frames_ok": check.correct == check.checked, "wrong_examples": check.examples,
        "peak_rss_mb": round(_rss_mb(), 1), "first_frame_ms": round(first_frame_ms, 2),
    }


def summarize(walls: list[float], cpus: list[float], frames: list[int]) -> dict:
    """Median and spread over repeats; throughput from the median repeat's wall time."""
    if not walls:
        return {}
    med = statistics.median(walls)
    per = statistics.median(frames)
    total_frames = sum(frames)
    return {
        "repeats": len(walls),
        "frames": int(per),
        "wall_s_median": round(med, 6),
        "wall_s_min": round(min(walls), 6),
        "wall_s_max": round(max(walls), 6),
        "frames_per_s": round(per / med, 2) if med > 0 else None,
        "cpu_ms_per_frame": round(1e3 * sum(cpus) / total_frames, 3) if total_frames else None,
        "cpu_util": round(sum(cpus) / sum(walls), 2) if sum(walls) > 0 else None,
    }

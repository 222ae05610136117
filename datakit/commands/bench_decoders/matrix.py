"""Which measurements a run makes: the main matrix, then the setting sweeps on one video.

Main matrix: every backend x video x pattern at the setting a data-loader worker uses by
default (1 decoder thread, decoder reused, exact seeks, one process). It feeds the
recommendation. The sweeps vary one setting at a time on a single "sweep video" (by default
AV1 480x640, LeRobot's default codec at a common camera size), because crossing every setting
with every video would take hours and mostly repeat what the main matrix says:
- threads: decoder threads for sequential decode and clips (0 = the library's choice);
- seek: TorchCodec's approximate seek mode against exact, for every random-access pattern;
- reuse: a decoder reopened for every sample, as naive `__getitem__` code does, and for
  the whole video in order (what conversion does per file: the ranking convert uses);
- workers: 2..N processes decoding clips at once, for throughput against CPU contention.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from datakit.machine import available_cpus
from datakit.commands.bench_decoders.measure import Job, Setting
from datakit.commands.bench_decoders.videos import BenchVideo


def default_workers() -> tuple[int, ...]:
    """1, 2, 4, ... up to the usable cores, and the core count itself."""
    n = available_cpus()
    out, w = [], 1
    while w < n:
        out.append(w)
        w *= 2
    return tuple(out + [n])


@dataclass(frozen=True, kw_only=True)
class MatrixConfig:
    backends: tuple[str, ...]
    patterns: tuple[str, ...]
    thread_sweep: tuple[int, ...] = (0, 2, 4)  # besides 1, which the main matrix has
    seek_modes: tuple[str, ...] = ("approximate",)  # besides exact
    reopen: bool = True
    workers: tuple[int, ...] = field(default_factory=default_workers)
    sweep_video: str = "auto"  # a video label, "auto", or "none" for no sweeps
    repeats: int = 5
    min_repeats: int = 2
    max_s: float = 6.0  # decode seconds per job before repeats stop (after min_repeats)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.backends or not self.patterns:
            raise ValueError("need at least one backend and one pattern")
        if self.repeats < 1 or self.min_repeats < 1:
            raise ValueError("repeats and min_repeats must be >= 1")


def pick_sweep_video(videos: list[BenchVideo], choice: str) -> BenchVideo | None:
    if choice == "none" or not videos:
        return None
    if choice != "auto":
        for v in videos:
            if v.label == choice or str(v.path) == choice:
                return v
        raise ValueError(f"--sweep-video {choice!r} is none of: {', '.join(v.label for v in videos)}")

    def score(v: BenchVideo) -> tuple:
        return (v.codec != "av1", abs(v.height - 480), v.label)

    return min(videos, key=score)


def build(videos: list[BenchVideo], cfg: MatrixConfig) -> list[Job]:
    """All jobs, main matrix first (smallest videos first) so early results are useful."""
    common = dict(repeats=cfg.repeats, min_repeats=cfg.min_repeats, max_s=cfg.max_s, seed=cfg.seed)
    jobs = [Job(backend=b, video=v, pattern=p, group="main", **common)
            for v in sorted(videos, key=lambda v: v.height * v.width) for p in cfg.patterns for b in cfg.backends]
    sv = pick_sweep_video(videos, cfg.sweep_video)
    if sv is None:
        return jobs
    random_patterns = [p for p in cfg.patterns if p != "sequential"]
    for t in cfg.thread_sweep:
        if t == 1:
            continue
        for p in [p for p in cfg.patterns if p in ("sequential", "clip")]:
            jobs += [Job(backend=b, video=sv, pattern=p, group="threads", setting=Setting(threads=t), **common)
                     for b in cfg.backends]
    for mode in cfg.seek_modes:
        if mode == "exact":
            continue
        jobs += [Job(backend=b, video=sv, pattern=p, group="seek", setting=Setting(seek_mode=mode), **common)
                 for p in random_patterns for b in cfg.backends if b.startswith("torchcodec")]
    if cfg.reopen:  # sequential reopened: conversion-shaped, the ranking convert --decoder auto uses
        jobs += [Job(backend=b, video=sv, pattern=p, group="reuse", setting=Setting(reuse=False), **common)
                 for p in cfg.patterns if p in ("sequential", "single", "clip") for b in cfg.backends]
    if "clip" in cfg.patterns:
        for w in cfg.workers:
            if w > 1:
                jobs += [Job(backend=b, video=sv, pattern="clip", group="workers", setting=Setting(workers=w),
                             **common) for b in cfg.backends]
    return jobs

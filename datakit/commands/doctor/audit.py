"""Audit a whole source dataset: scan it, check its metadata, audit every episode on a process
pool with a progress bar, then the checks that need every episode (`crosschecks`).

A defect never stops the audit. Only input that cannot be a dataset at all (a missing folder, a
folder of neither format) raises SourceError; a dataset whose metadata cannot be scanned gives a
report with that one `metadata` finding.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from datakit.commands.doctor.crosschecks import dataset_findings
from datakit.commands.doctor.episode import EpisodeAudit, audit_episode
from datakit.commands.doctor.frames import FrameAuditOptions
from datakit.progress import Progress, progress_bar
from datakit.machine import start_method
from datakit.errors import SourceError
from datakit.sources import detect_format, scan
from datakit.sources.checks import ERROR, WARNING, Finding, check_dataset
from datakit.sources.episode import DatasetSpec

SEVERITY_ORDER = {ERROR: 0, WARNING: 1}


@dataclass
class DoctorReport:
    """Everything `datakit doctor` found in one source dataset."""

    source: str
    format: str | None = None  # "lerobot" | "droid" (None if undetected)
    version: str | None = None  # e.g. "v3.0", "droid-raw" (None if the scan failed)
    episodes: int = 0
    frames_decoded: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings

    def counts(self) -> dict[str, int]:
        """Number of findings per kind."""
        out: dict[str, int] = {}
        for f in self.findings:
            out[f.kind] = out.get(f.kind, 0) + 1
        return dict(sorted(out.items()))


# --- the process pool: the spec is sent once per worker, then only episode positions ----------
_WORKER: dict = {}


def _init_worker(spec: DatasetSpec, opts: FrameAuditOptions) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (no tracebacks)
    _WORKER["spec"], _WORKER["opts"] = spec, opts


def _audit_at(position: int) -> EpisodeAudit:
    spec = _WORKER["spec"]
    return audit_episode(spec, spec.episodes[position], _WORKER["opts"])


def _crashed(spec: DatasetSpec, position: int, e: BaseException) -> EpisodeAudit:
    ref = spec.episodes[position]
    return EpisodeAudit(ref.episode_index, [Finding("audit_failed", str(ref.source),
                                                    f"episode {ref.episode_index}: audit worker failed "
                                                    f"({type(e).__name__}: {e})", ref.episode_index)])


def _audit_on_pool(spec: DatasetSpec, opts: FrameAuditOptions, workers: int, out: list, bar: Progress) -> None:
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(start_method()), initializer=_init_worker,
                               initargs=(spec, opts))
    try:
        futures: dict[Future, int] = {pool.submit(_audit_at, i): i for i in range(len(out))}
        for fut in as_completed(futures):
            i = futures[fut]
            try:  # BrokenProcessPool when a worker dies (OOM killer): a finding, not a hang
                out[i] = fut.result()
            except Exception as e:
                out[i] = _crashed(spec, i, e)
            bar.update(1)
    except BaseException:  # Ctrl-C, SIGTERM as SystemExit: stop the workers now, not after their episode
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def audit_episodes(spec: DatasetSpec, opts: FrameAuditOptions, workers: int = 1,
                   progress: bool = True) -> list[EpisodeAudit]:
    """Audit every episode (in spec order), on `workers` processes (1: in this process)."""
    n = len(spec.episodes)
    out: list[EpisodeAudit | None] = [None] * n
    bar = progress_bar(n, f"doctor {spec.root.name}", enabled=progress, unit="episode")  # plain lines in a log
    try:
        if workers <= 1 or n <= 1:
            for i, ref in enumerate(spec.episodes):
                out[i] = audit_episode(spec, ref, opts)
                bar.update(1)
        else:
            _audit_on_pool(spec, opts, min(workers, n), out, bar)
    finally:
        bar.close()
    return [a for a in out if a is not None]


def audit_dataset(src: str | Path, *, fmt: str = "auto", workers: int = 1, frozen_seconds: float = 2.0,
                  progress: bool = True) -> DoctorReport:
    """Audit the dataset at `src` on `workers` processes; a camera showing identical frames for
    `frozen_seconds` or longer is frozen. Raises SourceError only when `src` is not a dataset folder."""
    t0 = time.perf_counter()
    src = Path(src)
    if not src.is_dir():
        raise SourceError(src, "no such folder")
    fmt = detect_format(src) if fmt == "auto" else fmt
    report = DoctorReport(str(src), fmt)
    try:
        spec = scan(src, fmt, check=False)  # check_dataset below lists every invariant broken
    except SourceError as e:
        report.findings.append(Finding("metadata", e.path, e.problem))
        report.seconds = time.perf_counter() - t0
        return report
    report.version, report.episodes = spec.version, len(spec.episodes)
    opts = FrameAuditOptions(frozen_frames=max(2, int(round(frozen_seconds * spec.fps))))
    report.findings += check_dataset(spec)
    audits = audit_episodes(spec, opts, workers, progress)
    for a in audits:
        report.findings += a.findings
        report.frames_decoded += a.frames_decoded
    report.findings += dataset_findings(spec, audits)
    report.seconds = time.perf_counter() - t0
    return report


__all__ = ["DoctorReport", "audit_dataset", "audit_episodes"]

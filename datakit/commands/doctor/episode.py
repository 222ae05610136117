"""Audit one episode in a worker process: its files, its table, and every camera's video.

Nothing here raises for a defect of the data: each becomes a Finding, so one bad episode (or one
bad file inside it) does not hide the others. The table invariants are the ones `convert` applies
(`datakit.sources.checks.check_episode_table`); this module adds what only a full read can see
(video and embedded-image decode, blank/frozen cameras) and the per-column ranges and task
indices the dataset-wide checks need.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datakit import source_paths
from datakit.commands.doctor.frames import FrameAuditOptions
from datakit.commands.doctor.images import audit_images
from datakit.commands.doctor.video import audit_video
from datakit.errors import SourceError
from datakit.sources import load_episode
from datakit.sources.checks import ERROR, Finding, check_episode_table
from datakit.sources.episode import DatasetSpec, EpisodeRef


@dataclass
class ColumnRange:
    """Smallest and largest finite value of each column (NaN where a column has none)."""

    low: np.ndarray
    high: np.ndarray

    @staticmethod
    def of(x: np.ndarray) -> "ColumnRange":
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or not len(x):
            n = x.shape[1] if x.ndim == 2 else 0
            return ColumnRange(np.full(n, np.nan), np.full(n, np.nan))
        finite = np.where(np.isfinite(x), x, np.nan)
        return ColumnRange(np.fmin.reduce(finite, axis=0), np.fmax.reduce(finite, axis=0))  # fmin/fmax skip NaN

    def merge(self, other: "ColumnRange") -> "ColumnRange":
        if self.low.shape != other.low.shape or self.high.shape != other.high.shape:
            return self  # a width mismatch is reported by check_episode_table
        return ColumnRange(np.fmin(self.low, other.low), np.fmax(self.high, other.high))


@dataclass
class EpisodeAudit:
    """What one worker sends back for one episode."""

    episode_index: int
    findings: list[Finding] = field(default_factory=list)
    frames_decoded: int = 0
    state: ColumnRange | None = None  # None when the table could not be read
    action: ColumnRange | None = None
    tasks_used: list[int] = field(default_factory=list)
    table_digest: str | None = None  # sha256 of the state and action values, to find duplicated episodes


def _table_file(spec: DatasetSpec, ref: EpisodeRef) -> Path:
    """The file holding the episode's table (a DROID episode's source is its folder)."""
    return Path(ref.source) / source_paths.DROID_TRAJECTORY if spec.format == "droid" else Path(ref.source)


def _missing_files(spec: DatasetSpec, ref: EpisodeRef) -> tuple[list[Finding], EpisodeRef]:
    """A finding per missing file of the episode, and the ref without its missing videos (so that
    the table, and the cameras that are there, are still audited)."""
    e, out, videos = ref.episode_index, [], {}
    table = _table_file(spec, ref)
    if not table.is_file():
        out.append(Finding("missing_file", str(table), f"episode {e}: missing table file", e))
    for cam, vs in ref.videos.items():
        if vs is not None and not Path(vs.path).is_file():
            out.append(Finding("missing_file", str(vs.path), f"episode {e} camera {cam}: missing video file", e))
            vs = None
        videos[cam] = vs
    return out, dataclasses.replace(ref, videos=videos)


def _table(spec: DatasetSpec, ref: EpisodeRef, audit: EpisodeAudit, opts: FrameAuditOptions) -> None:
    try:
        table = load_episode(spec, ref)
    except SourceError as e:
        audit.findings.append(Finding("table", e.path, f"episode {ref.episode_index}: {e.problem}",
                                      ref.episode_index))
        return
    audit.findings += check_episode_table(spec, ref, table)
    audit.state, audit.action = ColumnRange.of(table.state), ColumnRange.of(table.action)
    audit.tasks_used = sorted(int(t) for t in np.unique(table.task_index))
    if len(table):
        h = hashlib.sha256()
        for x in (table.state, table.action):
            h.update(repr(x.shape).encode())
            h.update(np.ascontiguousarray(x).tobytes())
        audit.table_digest = h.hexdigest()
    for cam, images in table.images.items():
        findings, n = audit_images(spec, ref, cam, images, opts)
        audit.findings += findings
        audit.frames_decoded += n


def audit_episode(spec: DatasetSpec, ref: EpisodeRef, opts: FrameAuditOptions) -> EpisodeAudit:
    """Every finding of one episode; an unforeseen exception becomes an `audit_failed` finding."""
    audit = EpisodeAudit(ref.episode_index)
    try:
        missing, present = _missing_files(spec, ref)
        audit.findings += missing
        if _table_file(spec, present).is_file():
            _table(spec, present, audit, opts)
        for cam, vs in present.videos.items():
            if vs is None:
                continue
            findings, n = audit_video(spec, present, cam, vs, opts)
            audit.findings += findings
            audit.frames_decoded += n
    except Exception as e:  # a bug or an unforeseen library error: report it, audit the rest
        audit.findings.append(Finding("audit_failed", str(ref.source),
                                      f"episode {ref.episode_index}: audit failed ({type(e).__name__}: {e})",
                                      ref.episode_index, None, ERROR))
    return audit


__all__ = ["ColumnRange", "EpisodeAudit", "audit_episode"]

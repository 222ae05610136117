"""Invariants of a source dataset, as a list of findings instead of a first exception.

`convert` and `scan` raise the first error-severity finding as a SourceError (`raise_first_error`);
`datakit doctor` calls the same functions to report all of them. Two levels:

- `check_dataset(spec)`: planning-time invariants over the scanned metadata (camera names that
  would make unsafe or too long tar members, no episodes, duplicated episodes, bad lengths,
  negative or overlapping v3.0 video time ranges, episode count vs the declared total).
- `check_episode_table(spec, ref, table)`: per-episode values (frame_index 0..n-1, timestamps
  going backwards, NaN/inf or float32-overflowing state/action, vector widths, task_index range).

Use `datakit.sources.scan(root, check=False)` to get a spec whose invariants are not yet enforced.
What cannot become a spec or a table still raises SourceError: `scan(check=False)` for metadata
too malformed to read (wrong types, bad templates, an unsafe LeRobot camera name), and
`load_episode` for a table that cannot be read as one episode (unreadable file, rows of another
episode, vector rows of different widths or nulls, row count vs metadata length); turn those into
findings with `finding_from_error`. Videos: `datakit.decoders.integrity.strict_decode_error`.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from datakit.errors import SourceError
from datakit.shards.index import FRAME_KEY
from datakit.sources.episode import DatasetSpec, EpisodeRef, EpisodeTable

ERROR = "error"  # convert rejects it
WARNING = "warning"  # convert accepts it, but it silently hurts training
NONFINITE_POLICIES = ("reject", "keep")
FLOAT32_MAX = float(np.finfo(np.float32).max)
# slack (in frames) allowed when two v3.0 episodes share a video file boundary
RANGE_SLACK_FRAMES = 0.5
# a v3.0 from_timestamp further than this (in frames) from a frame time picks its first frame by rounding
OFF_GRID_FRAMES = 0.25
# fields of every sample besides the cameras (shards/writer.py): a camera may not take their names
RESERVED_MEMBER_FIELDS = ("state", "action", "json")
# a USTAR header (shards/writer.py) holds a member name split at a '/' into a 155-byte prefix and a
# 100-byte name: `<frame:06d>.<camera>.npy` must fit the 100 (frame numbers up to 999999)
USTAR_NAME_BYTES = 100
CAMERA_NAME_BYTES = USTAR_NAME_BYTES - len(FRAME_KEY.format(episode=0, frame=0).rsplit("/", 1)[-1] + "." + ".npy")


# every kind of Finding, from these checks and from `datakit doctor`: kind -> (its severity, what it
# means). `doctor --ignore` takes only these, so a typo is refused instead of filtering nothing;
# `datakit doctor --list-checks` prints this table.
FINDINGS: dict[str, tuple[str, str]] = {
    "metadata": (ERROR, "the dataset's metadata cannot be scanned (info.json, episode or task tables)"),
    "empty_dataset": (ERROR, "the dataset has no episodes"),
    "duplicate_episode": (ERROR, "two episodes have the same episode_index"),
    "bad_episode_index": (ERROR, "an episode_index is negative"),
    "bad_length": (ERROR, "an episode's length is not a positive frame count"),
    "bad_video_range": (ERROR, "a v3.0 episode's video time range is negative, empty or not finite"),
    "overlapping_video_range": (ERROR, "two v3.0 episodes overlap in one video file"),
    "video_range_off_grid": (WARNING, "a v3.0 from_timestamp falls between frames (its first frame is ambiguous)"),
    "shared_video": (ERROR, "two episodes claim one whole video file"),
    "episode_count": (ERROR, "total_episodes differs from the episodes the metadata lists"),
    "episode_gap": (ERROR, "episode_index has gaps (a warning when no total_episodes is declared)"),
    "unsafe_camera_name": (ERROR, "a camera name cannot be a tar member name (unsafe, reserved or too long)"),
    "missing_file": (ERROR, "an episode's table or video file is missing"),
    "table": (ERROR, "an episode table is unreadable or inconsistent"),
    "length_mismatch": (ERROR, "an episode table's row count differs from the metadata's length"),
    "frame_index": (ERROR, "frame_index is not 0..n-1 in order"),
    "timestamp": (ERROR, "a timestamp goes backwards or is not finite"),
    "timestamp_gap": (WARNING, "timestamps off the fps grid (a gap or dropped frames)"),
    "task_index": (ERROR, "a task_index names no known task"),
    "vector_width": (ERROR, "a state or action row has another width than the dataset's"),
    "nonfinite": (ERROR, "NaN, inf or a value beyond float32 in state or action"),
    "video_unreadable": (ERROR, "a video file cannot be opened"),
    "video_fps": (ERROR, "a video's frame rate differs from the dataset's fps"),
    "video_size": (ERROR, "a video's frame size differs from the declared one"),
    "video_decode_error": (ERROR, "a frame does not decode"),
    "video_corrupt_frame": (ERROR, "a frame decodes with concealed damage"),
    "video_frame_count": (ERROR, ("a video decodes another frame count than the episode's length "
                                  "(a warning when off by one, or when only the container's count differs)")),
    "video_timestamps": (ERROR, "packet timestamps repeat, go backwards or skip frames"),
    "image_unreadable": (ERROR, "an image stored in the table does not decode"),
    "image_size": (ERROR, "an image stored in the table has another size than the declared one"),
    "blank_camera": (WARNING, "every frame of a camera is one constant colour"),
    "frozen_camera": (WARNING, "a camera shows identical frames for --frozen-seconds or longer"),
    "constant_column": (WARNING, "a state or action column has one value in every frame"),
    "unused_task": (WARNING, "a task is used by no episode"),
    "duplicate_episode_content": (WARNING, "an episode has the same state and action values as an earlier one"),
    "audit_failed": (ERROR, "an unforeseen error while auditing one episode (the others are still audited)"),
}
FINDING_KINDS = tuple(FINDINGS)


@dataclass(frozen=True)
class Finding:
    """One defect of a source: what kind, which file, a one-line message, where in the data."""

    kind: str  # one of FINDING_KINDS
    path: str
    message: str
    episode: int | None = None
    frame: int | None = None
    severity: str = ERROR  # "error" = convert rejects it, "warning" = silently hurts training

    def __post_init__(self) -> None:
        if self.kind not in FINDING_KINDS:  # register a new kind above, or --ignore refuses it
            raise ValueError(f"unregistered finding kind {self.kind!r}")


def finding_from_error(err: SourceError, kind: str, episode: int | None = None) -> Finding:
    """A SourceError raised while scanning or loading, as an error-severity finding."""
    return Finding(kind, err.path, err.problem, episode)


def raise_first_error(findings: list[Finding]) -> None:
    """Raise the first error-severity finding as a SourceError naming its file (warnings pass)."""
    for f in findings:
        if f.severity == ERROR:
            raise SourceError(f.path, f.message)


def member_name_problem(name: object) -> str | None:
    """Why a camera name cannot be part of a tar member name `KEY.<name>.npy`, or None if it can.

    A member must stay inside its sample for tarfile extraction and for webdataset, which splits
    samples at `/`: so no `/` (hence no leading `/` and no `..` path component), no backslash,
    no NUL or other control characters, no empty name, no `..` at all, and not the name of
    another field of the sample (`state`, `action`)."""
    if not isinstance(name, str):
        return f"is not a string ({type(name).__name__})"
    if not name.strip():
        return "is empty"
    if "/" in name or "\\" in name:
        return "contains a path separator ('/' or '\\')"
    if ".." in name:
        return "contains '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a NUL or control character"
    if name.startswith(".") or name.endswith("."):
        return "starts or ends with '.'"
    if name in RESERVED_MEMBER_FIELDS:
        return f"is one of the reserved member fields {', '.join(RESERVED_MEMBER_FIELDS)}"
    return None


def camera_name_problem(name: object) -> str | None:
    """Why a camera name cannot be part of every tar member name `<episode>/<frame>.<name>.npy`
    the shard writer makes (USTAR headers), or None if it can: `member_name_problem`, and the
    length: ustar keeps the part after the key's '/' in USTAR_NAME_BYTES bytes."""
    if problem := member_name_problem(name):
        return f"{problem}: it would give a tar member outside its sample"
    size = len(name.encode("utf-8"))  # member_name_problem: a str
    if size > CAMERA_NAME_BYTES:
        return (f"is {size} bytes long: a tar member name ('<frame>.<camera>.npy', ustar) holds "
                f"{USTAR_NAME_BYTES} bytes, which leaves at most {CAMERA_NAME_BYTES} for the camera name")
    return None


def _camera_findings(spec: DatasetSpec, where: str) -> list[Finding]:
    out = []
    for cam in spec.cameras:
        problem = camera_name_problem(cam)
        if problem:
            out.append(Finding("unsafe_camera_name", where, f"camera name {cam!r} {problem}"))
    return out


def _metadata_file(spec: DatasetSpec) -> str:
    from datakit import source_paths

    return str(spec.root / source_paths.LEROBOT_INFO) if spec.format == "lerobot" else str(spec.root)


def _episode_findings(spec: DatasetSpec) -> list[Finding]:
    out = []
    seen: dict[int, EpisodeRef] = {}
    for ref in spec.episodes:
        if ref.episode_index < 0:
            out.append(Finding("bad_episode_index", str(ref.source),
                               f"negative episode_index {ref.episode_index}", ref.episode_index))
        if ref.episode_index in seen:
            out.append(Finding("duplicate_episode", str(ref.source),
                               f"episode {ref.episode_index} is listed more than once "
                               f"(also by {seen[ref.episode_index].source})", ref.episode_index))
        seen.setdefault(ref.episode_index, ref)
        if ref.length <= 0:
            out.append(Finding("bad_length", str(ref.source),
                               f"episode {ref.episode_index} has length {ref.length} (must be > 0)", ref.episode_index))
    return out


def _range_findings(spec: DatasetSpec) -> list[Finding]:
    """v3.0 time ranges: finite, 0 <= from < to, and no two episodes overlapping in one file;
    a whole-file video (v2.x, DROID) belongs to one episode only."""
    out = []
    by_file: dict[str, list[tuple[float, float, int, str]]] = defaultdict(list)
    whole: dict[str, int] = {}  # a file that holds one whole episode: which one
    for ref in spec.episodes:
        for cam, vs in ref.videos.items():
            if vs is None:
                continue
            if vs.to_timestamp is None:
                other = whole.setdefault(str(vs.path), ref.episode_index)
                if other != ref.episode_index:
                    out.append(Finding("shared_video", str(vs.path), f"episodes {other} and {ref.episode_index} "
                                                                      f"both claim this whole video file", ref.episode_index))
                continue
            a, b = vs.from_timestamp, vs.to_timestamp
            if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b <= a:
                out.append(Finding("bad_video_range", str(vs.path),
                                   f"episode {ref.episode_index} camera {cam}: time range "
                                   f"[{a:g}, {b:g}) is negative, empty or not finite", ref.episode_index))
                continue
            by_file[str(vs.path)].append((a, b, ref.episode_index, cam))
            off = abs(a * spec.fps - round(a * spec.fps)) if spec.fps > 0 else 0.0
            if off > OFF_GRID_FRAMES:
                out.append(Finding("video_range_off_grid", str(vs.path),
                                   f"episode {ref.episode_index} camera {cam}: from_timestamp {a:g} is {off:.2f} "
                                   f"frames off the {spec.fps:g} fps grid (its first frame is ambiguous)",
                                   ref.episode_index, None, WARNING))
    slack = RANGE_SLACK_FRAMES / spec.fps if spec.fps > 0 else 0.0
    for path, ranges in by_file.items():
        ranges.sort()
        for (a0, b0, e0, _), (a1, b1, e1, cam) in zip(ranges, ranges[1:]):
            if a1 < b0 - slack:
                out.append(Finding("overlapping_video_range", path,
                                   f"episodes {e0} [{a0:g}, {b0:g}) and {e1} [{a1:g}, {b1:g}) overlap in "
                                   f"camera {cam}'s video file", e1))
    return out


def check_dataset(spec: DatasetSpec) -> list[Finding]:
    """Planning-time invariants of a scanned dataset (metadata and episode tables, no video)."""
    if not spec.episodes:
        return [Finding("empty_dataset", str(spec.root), "dataset has no episodes")]
    out = _camera_findings(spec, _metadata_file(spec))
    out += _episode_findings(spec)
    out += _range_findings(spec)
    out += _count_findings(spec)
    return out


def _count_findings(spec: DatasetSpec) -> list[Finding]:
    """Episode numbers against the declared total: with a total, they must be exactly 0..total-1
    (an error); without one, a gap is only a warning (a subset of a dataset is legitimate)."""
    indices = sorted({ref.episode_index for ref in spec.episodes})
    declared = spec.total_episodes
    where = _metadata_file(spec)
    if declared is not None and declared != len(spec.episodes):
        return [Finding("episode_count", where, f"total_episodes is {declared} but the episode metadata "
                                                f"lists {len(spec.episodes)} episodes")]
    present = [i for i in indices if i >= 0]
    n_missing = (present[-1] + 1 - len(present)) if present else 0
    if n_missing <= 0:
        return []
    missing = _first_missing(present, 5)  # without building range(max): an index may be huge
    shown = ", ".join(map(str, missing)) + (", ..." if n_missing > len(missing) else "")
    sev = ERROR if declared is not None else WARNING
    return [Finding("episode_gap", where, f"episode_index has gaps: {n_missing} missing ({shown})"
                                          + (f" although total_episodes is {declared}" if declared is not None else ""),
                    missing[0], None, sev)]


def _first_missing(present: list[int], limit: int) -> list[int]:
    """The first `limit` non-negative integers absent from the sorted, distinct `present`."""
    out, expect = [], 0
    for i in present:
        while expect < i and len(out) < limit:
            out.append(expect)
            expect += 1
        if len(out) >= limit:
            break
        expect = i + 1
    return out


def _first_bad_row(mask: np.ndarray) -> tuple[int, int]:
    """(frame, column) of the first True in a (T, D) mask."""
    t, d = np.argwhere(mask)[0]
    return int(t), int(d)


def _vector_findings(spec: DatasetSpec, ref: EpisodeRef, name: str, x: np.ndarray, names: list[str],
                     nonfinite: str) -> list[Finding]:
    src, e = str(ref.source), ref.episode_index
    out = []
    if x.ndim != 2 or x.shape[1] != len(names):
        out.append(Finding("vector_width", src, f"episode {e}: {name} has shape {tuple(x.shape)}, "
                                                f"the dataset declares {len(names)} values per frame", e))
        return out
    x64 = np.asarray(x, np.float64)
    bad = ~np.isfinite(x64) | (np.abs(np.nan_to_num(x64, nan=0.0, posinf=0.0, neginf=0.0)) > FLOAT32_MAX)
    if bad.any():
        t, d = _first_bad_row(bad)
        col = names[d] if d < len(names) else str(d)
        sev = ERROR if nonfinite == "reject" else WARNING
        what = "not finite" if not np.isfinite(x64[t, d]) else "outside float32 range"
        out.append(Finding("nonfinite", src, f"episode {e} frame {t}: {name} column {col!r} is {what} "
                                             f"({x64[t, d]!r}; {int(bad.sum())} such values in the episode)",
                           e, t, sev))
    return out


def check_episode_table(spec: DatasetSpec, ref: EpisodeRef, table: EpisodeTable,
                        nonfinite: str = "reject") -> list[Finding]:
    """Per-episode values: frame_index 0..n-1, timestamps, task_index range, state/action widths and
    NaN/inf/float32 overflow (an error with nonfinite="reject", a warning with "keep")."""
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, not {nonfinite!r}")
    src, e, n = str(ref.source), ref.episode_index, len(table)
    out = []
    if n != ref.length:
        out.append(Finding("length_mismatch", src, f"episode {e}: table has {n} rows, metadata says {ref.length}", e))
    fi = np.asarray(table.frame_index)
    if not np.array_equal(fi, np.arange(n)):
        t = int(np.argmax(fi != np.arange(n))) if fi.shape == (n,) else 0
        out.append(Finding("frame_index", src, f"episode {e}: frame_index is not 0..{n - 1} in order "
                                               f"(frame {t} has frame_index {fi[t] if t < len(fi) else None})", e, t))
    ts = np.asarray(table.timestamp, np.float64)
    if ts.shape == (n,) and n:
        if not np.isfinite(ts).all():
            t = int(np.argmax(~np.isfinite(ts)))
            out.append(Finding("timestamp", src, f"episode {e} frame {t}: timestamp is {ts[t]!r}", e, t))
        elif n > 1 and (np.diff(ts) < 0).any():
            t = int(np.argmax(np.diff(ts) < 0)) + 1
            out.append(Finding("timestamp", src, f"episode {e} frame {t}: timestamp {ts[t]:g} goes backwards "
                                                 f"(previous {ts[t - 1]:g})", e, t))
        elif spec.fps > 0:
            drift = np.abs((ts - ts[0]) - np.arange(n) / spec.fps)
            if drift.max() > 0.5 / spec.fps:
                t = int(np.argmax(drift > 0.5 / spec.fps))
                out.append(Finding("timestamp_gap", src, f"episode {e} frame {t}: timestamp {ts[t]:g} is off the "
                                                         f"{spec.fps:g} fps grid by {drift[t]:.3g} s (a gap or "
                                                         f"dropped frames)", e, t, WARNING))
    ti = np.asarray(table.task_index)
    bad_task = (ti < 0) | (ti >= len(spec.tasks))
    if bad_task.any():
        t = int(np.argmax(bad_task))
        out.append(Finding("task_index", src, f"episode {e} frame {t}: task_index {int(ti[t])} is not a known task "
                                              f"({len(spec.tasks)} tasks)", e, t))
    out += _vector_findings(spec, ref, "state", table.state, spec.state_names, nonfinite)
    out += _vector_findings(spec, ref, "action", table.action, spec.action_names, nonfinite)
    return out


__all__ = ["ERROR", "FINDINGS", "FINDING_KINDS", "WARNING", "Finding", "NONFINITE_POLICIES", "check_dataset",
           "check_episode_table", "camera_name_problem", "finding_from_error", "member_name_problem",
           "raise_first_error"]

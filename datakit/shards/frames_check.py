"""Check the per-frame table (`frames.arrow`) against the manifest, vectorised over all rows.

Two depths:
- `check_reads`: what a reader needs before it slices bytes (every row's shard exists, every
  offset is -1 or lies inside its shard with room for a whole frame). Readers run it on open;
  it is a few numpy passes over the columns (well under a second at 10M rows).
- `table_problems`: everything the manifest implies about each row, for `datakit verify`:
  each episode's rows hold that episode, frames 0..length-1, its shard; each shard's row range
  holds only that shard; task indices exist. A shifted `row_start`, a swapped shard number or a
  damaged episode/frame column shows up here even when checksums.json was rewritten to match.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from datakit.errors import IndexFileError
from datakit.shards.index import OFFSET_PREFIX, ShardIndex, column
from datakit.shards.names import FRAMES_NAME

CHUNK_ROWS = 1 << 22  # rows per block of the vectorised checks (bounded temporaries)


def offset_problems(index: ShardIndex, shard: np.ndarray, offsets: dict[str, np.ndarray]) -> list[str]:
    """Rows whose shard number or camera offsets cannot be read (messages name the row).

    Runs over blocks of CHUNK_ROWS rows, so the temporaries stay ~100 MB at any table size."""
    sizes = np.array([s.bytes for s in index.shards], np.int64)
    first: dict[str, tuple[int, str]] = {}  # kind -> (row, message) of its first bad row
    counts: dict[str, int] = {}

    def note(kind: str, bad: np.ndarray, lo: int, message) -> None:
        if bad.size:
            counts[kind] = counts.get(kind, 0) + int(bad.size)
            if kind not in first:
                r = lo + int(bad[0])
                first[kind] = (r, message(r))

    for lo in range(0, len(shard), CHUNK_ROWS):
        sh = shard[lo : lo + CHUNK_ROWS]
        out_of_range = (sh < 0) | (sh >= len(index.shards))
        note("shard", np.flatnonzero(out_of_range), lo,
             lambda r: f"column 'shard' row {r}: shard {int(shard[r])} is out of range (the index has {len(index.shards)})")
        size = sizes[np.where(out_of_range, 0, sh)] if sizes.size else np.zeros(sh.shape, np.int64)
        for cam, offs in offsets.items():
            fb, off, col = index.cameras[cam].frame_bytes, offs[lo : lo + CHUNK_ROWS], OFFSET_PREFIX + cam
            note(col + " <", np.flatnonzero(off < -1), lo,
                 lambda r, col=col, offs=offs: f"column {col!r} row {r}: negative offset {int(offs[r])}")
            note(col + " >", np.flatnonzero((off >= 0) & ~out_of_range & (off + fb > size)), lo,
                 lambda r, col=col, offs=offs, fb=fb: f"column {col!r} row {r}: offset {int(offs[r])} + {fb} frame "
                                                      f"bytes runs past the end of {index.shards[int(shard[r])].name}")
    return [f"{msg} ({counts[kind]} rows)" for kind, (_, msg) in first.items()]


def task_problems(index: ShardIndex, task: np.ndarray) -> list[str]:
    """Rows whose task_index names no task of the manifest."""
    bad = np.flatnonzero((task < 0) | (task >= len(index.tasks)))
    if not bad.size:
        return []
    r = int(bad[0])
    return [f"column 'task_index' row {r}: {int(task[r])} is not a task (the index has {len(index.tasks)}; "
            f"{bad.size} rows)"]


def check_reads(index: ShardIndex, shard: np.ndarray, offsets: dict[str, np.ndarray], root: Path,
                task: np.ndarray | None = None) -> None:
    """Raise IndexFileError naming frames.arrow when a row would read outside its shard (or,
    given `task`, name a task the manifest does not have)."""
    problems = offset_problems(index, shard, offsets) + (task_problems(index, task) if task is not None else [])
    if problems:
        raise IndexFileError(Path(root) / FRAMES_NAME, problems[0])


def table_problems(index: ShardIndex, frames: pa.Table) -> list[str]:
    """Every disagreement between the rows of `frames` and the manifest, one message per kind."""
    shard = column(frames, "shard")
    offsets = {cam: column(frames, OFFSET_PREFIX + cam) for cam in index.cameras}
    problems = offset_problems(index, shard, offsets)
    n = len(shard)
    want_ep = np.full(n, -1, np.int64)
    want_fr = np.zeros(n, np.int64)
    want_shard = np.full(n, -1, np.int64)
    for e in index.episodes:
        rows = slice(e.row_start, e.row_start + e.length)
        want_ep[rows] = e.episode_index
        want_fr[rows] = np.arange(e.length)
        want_shard[rows] = e.shard
    for s_i, s in enumerate(index.shards):
        outside = np.flatnonzero(want_shard[s.rows[0] : s.rows[1]] != s_i)
        if outside.size:
            problems.append(f"shards[{s_i}].rows [{s.rows[0]}, {s.rows[1]}) hold row {s.rows[0] + int(outside[0])} "
                            f"of an episode of another shard")
    checks = (("episode_index", column(frames, "episode_index"), want_ep),
              ("frame_index", column(frames, "frame_index"), want_fr),
              ("shard", shard.astype(np.int64), want_shard))
    for name, got, want in checks:
        bad = np.flatnonzero(got != want)
        if bad.size:
            r = int(bad[0])
            problems.append(f"column {name!r} row {r}: {int(got[r])}, index.json's episodes say {int(want[r])} "
                            f"({bad.size} rows; a shifted row_start or a damaged column)")
    return problems + task_problems(index, column(frames, "task_index"))

"""Which (episode, t) anchors a config can sample, and the rows each sample reads.

A sample is an anchor row t plus offsets (frames per camera, state, the action horizon).
Everything here is vectorised numpy over the per-frame table, so building the anchor list of
a DROID-sized index (tens of millions of frames) takes well under a second and no tar read.
Windows are clamped to their episode and come with an `is_pad` mask, like LeRobot's
`delta_timestamps` queries, so a sample never mixes two episodes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpisodeRows:
    """Where each episode sits in the frames table (one entry per converted episode)."""

    episode_index: np.ndarray  # (E,) int64
    row_start: np.ndarray  # (E,) int64, first row of the episode
    length: np.ndarray  # (E,) int64

    def of_rows(self, num_rows: int) -> np.ndarray:
        """(N,) position in this table of each row's episode (rows are in episode order);
        int32, half the memory of int64 at 100M rows (a table has far fewer than 2**31 episodes)."""
        pos = np.full(num_rows, -1, np.int32)
        for e, (s, n) in enumerate(zip(self.row_start.tolist(), self.length.tolist())):
            pos[s : s + n] = e
        if (pos < 0).any():
            raise ValueError(f"{int((pos < 0).sum())} rows of the frames table belong to no episode")
        return pos


@dataclass(frozen=True)
class Window:
    """The relative rows one sample touches: lo <= every offset <= hi."""

    frame_lo: int  # smallest image frame offset
    frame_hi: int  # largest image frame offset
    lo: int  # smallest offset of anything (frames, state, 0)
    hi: int  # largest offset of anything (frames, state, last action)

    @classmethod
    def of(cls, frame_offsets: list[tuple[int, ...]], state_offsets: tuple[int, ...], horizon: int) -> "Window":
        flat = [o for offs in frame_offsets for o in offs] or [0]
        lo = min(min(flat), min(state_offsets), 0)
        hi = max(max(flat), max(state_offsets), horizon - 1)
        return cls(frame_lo=min(flat), frame_hi=max(flat), lo=lo, hi=hi)


def anchor_rows(episodes: EpisodeRows, window: Window, boundary: str) -> np.ndarray:
    """(M,) int64 rows that may anchor a sample, in table order.

    "pad": every frame of every episode. "skip": only t with the whole window inside the
    episode. Raises ValueError, with the reason, when the window cannot fit the index.
    """
    lengths = episodes.length
    longest = int(lengths.max()) if lengths.size else 0
    frame_span = window.frame_hi - window.frame_lo + 1
    if frame_span > longest:
        raise ValueError(
            f"the frame window spans {frame_span} frames (offsets {window.frame_lo}..{window.frame_hi}) "
            f"but the longest episode in the index has {longest}"
        )
    if boundary == "pad":
        first = episodes.row_start
        count = lengths
    else:
        span = window.hi - window.lo + 1
        count = np.maximum(lengths - (span - 1), 0)
        first = episodes.row_start - window.lo
        if not count.any():
            raise ValueError(
                f"boundary='skip' needs episodes of at least {span} frames (offsets {window.lo}..{window.hi}, "
                f"action horizon included) but the longest has {longest}; use boundary='pad' or a smaller window"
            )
    return _ranges(first, count)


def _ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Concatenate arange(first[i], first[i] + count[i]) for all i, without a Python loop."""
    count = count.astype(np.int64)
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    keep = count > 0
    first, count = first[keep].astype(np.int64), count[keep]
    steps = np.ones(total, np.int64)
    starts = np.concatenate(([0], np.cumsum(count)[:-1]))
    steps[0] = first[0]
    steps[starts[1:]] = first[1:] - (first[:-1] + count[:-1] - 1)
    return np.cumsum(steps)


def window_rows(
    anchors: np.ndarray, offsets: tuple[int, ...], ep_start: np.ndarray, ep_len: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows (B, T) of `anchors + offsets`, clamped to each anchor's episode, and is_pad (B, T).

    `ep_start` / `ep_len` are per anchor. Clamping repeats the edge frame, as LeRobot does.
    """
    want = anchors[:, None] + np.asarray(offsets, np.int64)[None, :]
    lo = ep_start[:, None]
    hi = (ep_start + ep_len - 1)[:, None]
    is_pad = (want < lo) | (want > hi)
    return np.clip(want, lo, hi), is_pad

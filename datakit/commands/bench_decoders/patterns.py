"""Access patterns that trainers use, as lists of reads a benchmark repeat performs.

A decoder's speed depends less on the library than on how it is asked: a full sequential
pass (conversion) decodes every frame once, while a random frame from a long-GOP H.264 file
costs a seek plus decoding from the previous keyframe. So every pattern here mirrors one
training recipe, and every backend gets the very same frame indices (seeded per repeat).

Patterns:
- sequential: the whole video in order (what `datakit convert` does).
- clip: N consecutive frames from a random start (DreamZero-style, N=33), read as one range.
- strided: sparse frames, every `stride`-th frame inside a random window (video-LM style).
- single: one random frame per sample (Pi0.5-style observations).
- multiview: one random timestep read from each camera of an episode (3 views).
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Read:
    """One call on a decoder. `contiguous` reads go through `read_range` (one seek, then decode
    in order), the others through `get_frames` (the backend's random access)."""

    view: int
    indices: tuple[int, ...]
    contiguous: bool


@dataclass(frozen=True)
class Pattern:
    name: str
    samples: int  # samples per repeat (a sample is what one training example reads)
    clip_len: int = 33
    window: int = 64
    stride: int = 4
    views: int = 3
    doc: str = ""

    def reads(self, num_frames: int, seed: int) -> list[Read]:
        """The reads of one repeat. Raises ValueError when the video is too short."""
        n = int(num_frames)
        if n < 1:
            raise ValueError("video has no frames")
        rng = random.Random(seed)
        if self.name == "sequential":
            return [Read(0, tuple(range(n)), True)]
        if self.name == "clip":
            length = min(self.clip_len, n)
            starts = [rng.randrange(0, n - length + 1) for _ in range(self.samples)]
            return [Read(0, tuple(range(s, s + length)), True) for s in starts]
        if self.name == "strided":
            win = min(self.window, n)
            out = []
            for _ in range(self.samples):
                s = rng.randrange(0, n - win + 1)
                out.append(Read(0, tuple(range(s, s + win, self.stride)), False))
            return out
        if self.name == "single":
            return [Read(0, (rng.randrange(n),), False) for _ in range(self.samples)]
        if self.name == "multiview":
            out = []
            for _ in range(self.samples):
                t = rng.randrange(n)
                out.extend(Read(v, (t,), False) for v in range(self.views))
            return out
        raise ValueError(f"unknown pattern {self.name!r}")

    def frames_per_repeat(self, num_frames: int) -> int:
        return sum(len(r.indices) for r in self.reads(num_frames, 0))


PATTERNS: dict[str, Pattern] = {
    "sequential": Pattern("sequential", 1, doc="whole video in order (conversion)"),
    "clip": Pattern("clip", 2, doc="33 consecutive frames from a random start (DreamZero)"),
    "strided": Pattern("strided", 2, doc="every 4th frame of a random 64-frame window"),
    "single": Pattern("single", 8, doc="one random frame per sample (Pi0.5)"),
    "multiview": Pattern("multiview", 4, doc="one random timestep from 3 cameras"),
}


def get_pattern(name: str) -> Pattern:
    if name not in PATTERNS:
        raise ValueError(f"unknown pattern {name!r} (supported: {', '.join(PATTERNS)})")
    return PATTERNS[name]

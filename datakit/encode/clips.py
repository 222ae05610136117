"""The clip list: which clips of which episodes are encoded, a pure function of (seed, source index).

Why clips and not frames: the Wan VAE is causal (frame 0 alone, then groups of 4 through a conv
cache), so the latents of frames 4..16 encoded alone differ from the same frames inside a longer
clip. Features are stored per clip, and training samples from this list.

Per episode (rows `span = (frames - 1) * stride + 1` source frames per clip):
- clips_per_episode = 0: as many clips as fit without overlap, n = length // span, laid end to end
  from an offset drawn in [0, length - n * span] (so every frame can start a clip across seeds);
- clips_per_episode = k: min(k, length - span + 1) distinct starts drawn without replacement.
Draws use numpy's PCG64 seeded with [seed, episode_index]: the same clips for an episode whatever
the other episodes, the shard boundaries, the engine or the number of workers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datakit.shards.index import ShardIndex


@dataclass(frozen=True)
class Clip:
    episode_index: int
    start: int  # first source frame
    row: int  # the source frames table row of that frame
    task_index: int  # the task of the episode (an index into the source's tasks)


def episode_starts(length: int, span: int, seed: int, episode_index: int, per_episode: int) -> list[int]:
    """Sorted start frames of the clips of one episode (empty when it is shorter than a clip)."""
    if length < span:
        return []
    rng = np.random.default_rng([seed, episode_index])
    if per_episode == 0:
        n = length // span
        offset = int(rng.integers(0, length - n * span + 1))
        return [offset + span * i for i in range(n)]
    n = min(per_episode, length - span + 1)
    return sorted(int(s) for s in rng.choice(length - span + 1, size=n, replace=False))


def plan_clips(index: ShardIndex, task_of_row: np.ndarray, span: int, seed: int, per_episode: int,
               cameras: tuple[str, ...]) -> list[list[Clip]]:
    """Per source shard (one job each), its clips in episode and start order. Episodes where no
    camera of `cameras` (the one camera, or a canvas's slots) is real (convert's camera status) give
    no clip: black frames teach nothing. A canvas with some slots real keeps its clips, the other
    cells as the loader fills them (`encode/canvas.py`)."""
    jobs: list[list[Clip]] = [[] for _ in index.shards]
    for e in index.episodes:
        if not any(e.camera_status.get(c) == "real" for c in cameras):
            continue
        for s in episode_starts(e.length, span, seed, e.episode_index, per_episode):
            row = e.row_start + s
            jobs[e.shard].append(Clip(e.episode_index, s, row, int(task_of_row[row])))
    return jobs

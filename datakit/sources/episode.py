"""What every source yields: a cheap, picklable `EpisodeRef` per episode (paths only) and,
loaded in a worker, an `EpisodeTable` with its numeric columns. Decoding happens elsewhere."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class CameraSpec:
    """A camera as the source declares it (native size, before any resize)."""

    name: str  # e.g. "observation.images.top"
    height: int
    width: int
    storage: str  # "video" (mp4 files) or "image" (encoded images inside the parquet table)


@dataclass(frozen=True)
class VideoSlice:
    """Where one episode's frames of one camera live: a whole file (v2.x, DROID) or a time
    range of a multi-episode file (v3.0). Frame i of the episode is the frame of the file
    whose presentation time is `from_timestamp + i / fps`."""

    path: Path
    from_timestamp: float = 0.0
    to_timestamp: float | None = None  # None: up to the end of the file


@dataclass(frozen=True)
class EpisodeRef:
    """One episode to convert; holds paths, not data, so it crosses process boundaries cheaply."""

    episode_index: int
    length: int  # number of frames according to the source's metadata / table
    source: Path  # the file or folder that defines this episode (used in error messages)
    # camera name -> slice of a video file, or None when the source has no video for this
    # camera in this episode (slot "missing"). Cameras stored as images are not listed here.
    videos: dict[str, VideoSlice | None] = field(default_factory=dict)


@dataclass
class EpisodeTable:
    """The numeric and text columns of one episode, loaded from parquet / h5."""

    episode_index: int
    frame_index: np.ndarray  # (T,) int64
    timestamp: np.ndarray  # (T,) float64 seconds from the episode start
    # (T, S) / (T, A) float64 as read: values outside float32 range stay visible to the checks
    # (sources/checks.py); convert casts to float32 after checking
    state: np.ndarray
    action: np.ndarray
    task_index: np.ndarray  # (T,) int64 (index into DatasetSpec.tasks)
    task: str  # the episode's (first) task text
    # camera name -> per-frame encoded image bytes (PNG/JPEG), for `dtype: image` features
    images: dict[str, list[bytes]] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.frame_index.shape[0])


@dataclass(frozen=True)
class DatasetSpec:
    """A scanned source: format, declared schema and the list of episodes, in order."""

    root: Path
    format: str  # "lerobot" or "droid"
    version: str  # "v2.0" | "v2.1" | "v3.0" | "droid-raw"
    fps: float
    cameras: dict[str, CameraSpec]  # in a stable order (as declared)
    state_names: list[str]
    action_names: list[str]
    tasks: list[str]  # task_index -> text
    episodes: list[EpisodeRef]
    total_episodes: int | None = None  # as the metadata declares it (LeRobot info.json), if it does
    # what the source says of itself that readers may give back (LeRobot: robot_type and info.json's
    # features, for datakit.lerobot's meta); recorded in the index as source["described"]
    described: dict = field(default_factory=dict)


def task_text(tasks: list[str], task_index: int) -> str:
    """The text of one task_index ("" for an index the dataset does not list; the checks flag it)."""
    return tasks[task_index] if 0 <= task_index < len(tasks) else ""

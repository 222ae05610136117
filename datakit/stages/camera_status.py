"""Camera status detection: is a camera's video real content or constant padding (e.g. black)?"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datakit.shards.index import STATUS_BLANK, STATUS_MISSING, STATUS_REAL

# Largest deviation from a frame's own mean (in uint8 levels) that still counts as constant:
# covers codec noise on flat frames, far below any real scene's contrast.
BLANK_TOLERANCE = 10


@dataclass
class StatusDetector:
    """Fed every frame of one camera of one episode; `status` says real or blank."""

    tolerance: int = BLANK_TOLERANCE
    constant: bool = True
    frames: int = 0

    def update(self, frames: np.ndarray) -> None:
        """frames: (N, H, W, 3) uint8 RGB (before any NV12 packing); every 4th pixel is looked at."""
        self.frames += len(frames)
        if not self.constant or not len(frames):
            return
        sub = frames[:, ::4, ::4].reshape(len(frames), -1).astype(np.int16)
        dev = np.abs(sub - sub.mean(axis=1, keepdims=True).astype(np.int16)).max()
        if dev > self.tolerance:
            self.constant = False

    @property
    def status(self) -> str:
        if self.frames == 0:
            return STATUS_MISSING
        return STATUS_BLANK if self.constant else STATUS_REAL


def dataset_status(episode_statuses: list[str]) -> str:
    """A camera's top-level status: real if any episode has it real, else blank if any blank."""
    if STATUS_REAL in episode_statuses:
        return STATUS_REAL
    if STATUS_BLANK in episode_statuses:
        return STATUS_BLANK
    return STATUS_MISSING

"""What a camera's decoded frames say about it, whatever they were stored as (mp4 or images):
how many there are, whether the camera is blank, and where it is frozen.

- `blank_camera` (warning): every frame is one constant colour, by the same rule conversion uses
  to mark a padding slot (`datakit.stages.camera_status.StatusDetector`); reported at frame 0.
- `frozen_camera` (warning): at least `frozen_frames` consecutive identical frames, reported at the
  run's first frame. "Identical" allows for codec noise: a mean absolute difference of at most
  FROZEN_MEAN_DIFF levels. A blank camera is not reported as frozen as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from datakit.shards.index import STATUS_BLANK
from datakit.sources.checks import ERROR, WARNING, Finding
from datakit.sources.episode import EpisodeRef
from datakit.stages.camera_status import StatusDetector

# Mean absolute difference (uint8 levels, every 2nd pixel of the luma plane) at or below which two
# consecutive frames count as identical. A frozen source through H.264 decodes with differences of
# 0.05-0.45 (codec noise, measured on the synthetic videos); a moving scene differs by 10 or more.
FROZEN_MEAN_DIFF = 0.75


@dataclass(frozen=True)
class FrameAuditOptions:
    """What counts as a frozen camera."""

    frozen_frames: int = 30  # a run of at least this many identical frames is reported


class CameraTracker:
    """Fed one camera's frames of one episode in presentation order; collects its findings."""

    def __init__(self, cam: str, path: str, ref: EpisodeRef, opts: FrameAuditOptions):
        self.cam, self.path, self.episode, self.opts = cam, path, ref.episode_index, opts
        self.findings: list[Finding] = []
        self.decoded: set[int] = set()  # episode frame numbers seen
        self.status = StatusDetector()
        self._prev: np.ndarray | None = None  # the previous frame (subsampled), if it was frame index - 1
        self._last = -2
        self._run_start = 0
        self._run = 0

    @property
    def count(self) -> int:
        return len(self.decoded)

    def add(self, kind: str, frame: int | None, msg: str, severity: str = ERROR) -> None:
        """Record a finding about this camera (the message is prefixed with episode and camera)."""
        self.findings.append(Finding(kind, self.path, f"episode {self.episode} camera {self.cam}: {msg}",
                                     self.episode, frame, severity))

    def frame(self, index: int, plane: np.ndarray, rgb: Callable[[], np.ndarray]) -> None:
        """Frame `index` of the episode: `plane` is any 8-bit picture plane (the luma plane of a
        video frame, as decoded: no colour conversion) for the frozen check; `rgb()` gives the
        (H, W, 3) uint8 RGB frame, asked for only while the camera may still be blank (for a real
        camera: the first frame), because converting every frame would cost more than decoding."""
        self.decoded.add(index)
        if self.status.constant:  # once a frame is not constant the detector looks at no more
            self.status.update(rgb()[None])
        sub = plane[::2, ::2].astype(np.int16)
        follows = index == self._last + 1  # a frame that did not decode ends a run
        self._last = index
        if follows and self._prev is not None and np.abs(sub - self._prev).mean() <= FROZEN_MEAN_DIFF:
            self._run += 1
        else:
            self._end_run()
            self._run_start, self._run = index, 1
        self._prev = sub

    def _end_run(self) -> None:
        if self._run >= self.opts.frozen_frames:
            self.add("frozen_camera", self._run_start, f"{self._run} identical frames from frame "
                                                       f"{self._run_start} (a frozen camera)", WARNING)

    def finish(self) -> None:
        """Call after the last frame: reports a blank camera or a frozen run that reaches the end."""
        if self.count and self.status.status == STATUS_BLANK:
            self.add("blank_camera", 0, f"all {self.count} frames are one constant colour (a blank camera)",
                     WARNING)
        elif self.count:
            self._end_run()


__all__ = ["CameraTracker", "FROZEN_MEAN_DIFF", "FrameAuditOptions"]

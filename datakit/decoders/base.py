"""The one decoder interface every backend implements, and the probe all of them share.

A backend module exposes `open_video(path, *, threads, seek_mode) -> VideoDecoder`. A decoder is
opened once per file and reused for every read; frames come out as uint8 RGB (N, H, W, 3).
Frame i of a file is the frame presented at i / fps after the stream start.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from datakit.errors import SourceError


@dataclass(frozen=True)
class VideoInfo:
    codec: str  # e.g. "av1", "h264"
    width: int
    height: int
    fps: float
    num_frames: int  # from the container; may be an estimate for some muxers
    duration_s: float


class VideoDecoder(Protocol):
    backend: str
    path: Path
    info: VideoInfo

    def read_range(self, start: int, stop: int, chunk: int = 16) -> Iterator[np.ndarray]:
        """Decode frames [start, stop) in order, yielded in chunks of up to `chunk` (n, H, W, 3)."""
        ...

    def iter_frames(self, start: int, stop: int) -> Iterator[np.ndarray]:
        """Frames [start, stop) one at a time as (H, W, 3) uint8, without stacking copies."""
        ...

    def get_frames(self, indices: Sequence[int]) -> np.ndarray:
        """Random access: the frames at `indices` (any order) as (N, H, W, 3) uint8."""
        ...

    def close(self) -> None: ...


def read_chunks(path: Path, start: int, stop: int, chunk: int,
                read: Callable[[int, int], np.ndarray]) -> Iterator[np.ndarray]:
    """`read_range` of a backend that decodes a range at once: `read(a, b)` -> frames [a, b) as
    (n, H, W, 3), called per chunk; the backend's own error becomes a SourceError naming the frames."""
    for a in range(start, stop, chunk):
        b = min(a + chunk, stop)
        try:
            batch = read(a, b)
        except Exception as e:  # the backend's own decode error: bad input, named by frame
            raise SourceError(path, f"decode error in frames {a}..{b - 1} "
                                    f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        yield batch


class BackendUnavailable(RuntimeError):
    """The backend is not installed or cannot read this stream (e.g. Decord 0.6 and AV1)."""


# FFmpeg reports the decoder library's name; results and recommendations use the codec's.
_CODEC_NAMES = {"libdav1d": "av1", "libaom-av1": "av1", "av1_cuvid": "av1", "h264_cuvid": "h264"}


def probe_video(path: str | Path) -> VideoInfo:
    """Container metadata via PyAV; a clear SourceError for a missing or unreadable file."""
    import av

    p = Path(path)
    if not p.exists():
        raise SourceError(p, "missing video file")
    try:
        with av.open(str(p)) as c:
            return container_info(c, p)
    except SourceError:
        raise
    except Exception as e:  # av raises many error types for damaged files
        raise SourceError(p, f"corrupt or truncated video ({type(e).__name__}: {e})") from None


def container_info(container, path: Path) -> VideoInfo:
    """The VideoInfo of an open PyAV container's first video stream (what probe_video returns),
    so a decoder that opens the file anyway does not open it a second time to probe it."""
    if not container.streams.video:
        raise SourceError(path, "no video stream")
    s = container.streams.video[0]
    fps = float(s.average_rate or s.guessed_rate or 0)
    duration = float(s.duration * s.time_base) if s.duration else float(container.duration or 0) / 1e6
    n = int(s.frames) or int(round(duration * fps))
    codec = _CODEC_NAMES.get(s.codec_context.name, s.codec_context.name)
    return VideoInfo(codec, s.codec_context.width, s.codec_context.height, fps, n, duration)


def frame_indices_check(indices: Sequence[int], n: int, path: Path) -> list[int]:
    idx = [int(i) for i in indices]
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise SourceError(path, f"frame index {bad[0]} outside the video (0..{n - 1})")
    return idx


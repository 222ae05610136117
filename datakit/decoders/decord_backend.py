"""Decord backend (the `decord` module, e.g. from the decord2 package, which reads AV1)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from datakit.decoders.base import BackendUnavailable, VideoInfo, frame_indices_check, probe_video, read_chunks

NAME = "decord"


def version() -> str:
    import decord

    try:
        from importlib.metadata import version as dist_version

        return f"{decord.__version__} (decord2 {dist_version('decord2')})"
    except Exception:
        return decord.__version__


def _load_torchcodec_first() -> None:
    """decord2 and torchcodec bundle different FFmpeg builds; loading decord's first makes a
    later torchcodec decode crash the process (seen with decord2 3.4 + torchcodec 0.13), while
    the other order works. So torchcodec, when installed, is loaded before decord."""
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:
        pass


class DecordDecoder:
    backend = NAME

    def __init__(self, path: Path, threads: int):
        _load_torchcodec_first()
        try:
            import decord
        except ImportError as e:
            raise BackendUnavailable(f"decord is not installed ({e})") from None
        self.path = Path(path)
        self.info: VideoInfo = probe_video(self.path)
        try:
            self._vr = decord.VideoReader(str(self.path), ctx=decord.cpu(0), num_threads=max(0, int(threads)))
        except Exception as e:  # decord raises DECORDError for codecs it cannot read
            raise BackendUnavailable(f"decord cannot read {self.path.name} ({self.info.codec}): {e}") from None
        self.info = VideoInfo(
            self.info.codec, self.info.width, self.info.height, self.info.fps, len(self._vr), self.info.duration_s
        )

    def read_range(self, start: int, stop: int, chunk: int = 16) -> Iterator[np.ndarray]:
        return read_chunks(self.path, start, min(stop, len(self._vr)), chunk,
                           lambda a, b: self._vr.get_batch(list(range(a, b))).asnumpy())

    def iter_frames(self, start: int, stop: int) -> Iterator[np.ndarray]:
        for batch in self.read_range(start, stop, chunk=8):
            yield from batch  # views into the batch: no per-frame copy

    def get_frames(self, indices: Sequence[int]) -> np.ndarray:
        idx = frame_indices_check(indices, len(self._vr), self.path)
        return self._vr.get_batch(idx).asnumpy()

    def close(self) -> None:
        del self._vr


def open_video(path: str | Path, *, threads: int = 1, seek_mode: str = "exact") -> DecordDecoder:
    return DecordDecoder(Path(path), threads)

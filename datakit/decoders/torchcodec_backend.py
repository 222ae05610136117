"""TorchCodec backend (CPU; CUDA when asked for and available), frames NHWC uint8."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from datakit.decoders.base import BackendUnavailable, VideoInfo, frame_indices_check, probe_video, read_chunks

NAME = "torchcodec"


def version() -> str:
    import torchcodec

    return torchcodec.__version__


class TorchCodecDecoder:
    backend = NAME

    def __init__(self, path: Path, threads: int, seek_mode: str, device: str = "cpu"):
        try:
            from torchcodec.decoders import VideoDecoder
        except Exception as e:  # ImportError, or OSError when its FFmpeg libraries are missing
            raise BackendUnavailable(f"torchcodec is not usable ({type(e).__name__}: {e})") from None
        self.path = Path(path)
        self.info: VideoInfo = probe_video(self.path)
        try:
            self._dec = VideoDecoder(
                str(self.path), dimension_order="NHWC", num_ffmpeg_threads=max(0, int(threads)),
                seek_mode=seek_mode, device=device,
            )
        except Exception as e:
            raise BackendUnavailable(f"torchcodec cannot read {self.path.name}: {e}") from None
        n = self._dec.metadata.num_frames or self.info.num_frames
        self.info = VideoInfo(self.info.codec, self.info.width, self.info.height, self.info.fps, int(n), self.info.duration_s)

    def read_range(self, start: int, stop: int, chunk: int = 16) -> Iterator[np.ndarray]:
        return read_chunks(self.path, start, min(stop, self.info.num_frames), chunk,
                           lambda a, b: self._dec.get_frames_in_range(a, b).data.cpu().numpy())

    def iter_frames(self, start: int, stop: int) -> Iterator[np.ndarray]:
        for batch in self.read_range(start, stop, chunk=8):
            yield from batch  # views into the batch: no per-frame copy

    def get_frames(self, indices: Sequence[int]) -> np.ndarray:
        idx = frame_indices_check(indices, self.info.num_frames, self.path)
        return self._dec.get_frames_at(idx).data.cpu().numpy()

    def close(self) -> None:
        del self._dec


def open_video(path: str | Path, *, threads: int = 1, seek_mode: str = "exact") -> TorchCodecDecoder:
    return TorchCodecDecoder(Path(path), threads, seek_mode)

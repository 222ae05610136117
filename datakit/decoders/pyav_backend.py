"""PyAV backend: FFmpeg through `av`, streamed in presentation order with seek-then-skip.

Strict: FFmpeg's `err_detect` (STRICT_ERR_DETECT) makes the decoder fail on bitstream errors
it would otherwise conceal, and a frame FFmpeg marks corrupt is an error too; both are a
SourceError naming the file and frame. What this cannot see is in docs/convert.md "What decoding
cannot catch"."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from datakit.decoders.base import VideoInfo, container_info, frame_indices_check
from datakit.errors import SourceError

NAME = "pyav"
# FFmpeg decoder options: check CRCs / bitstream conformance / buffer overreads, and "explode":
# stop at the first error instead of concealing it
STRICT_ERR_DETECT = "crccheck+bitstream+buffer+explode"


def version() -> str:
    import av

    return av.__version__


class PyAVDecoder:
    backend = NAME

    def __init__(self, path: Path, threads: int):
        import av

        self.path = Path(path)
        if not self.path.exists():
            raise SourceError(self.path, "missing video file")
        try:  # one open: the probe's metadata comes from the container this decoder reads
            self._container = av.open(str(self.path))
        except Exception as e:  # av raises many error types for damaged files
            raise SourceError(self.path, f"corrupt or truncated video ({type(e).__name__}: {e})") from None
        try:
            self.info: VideoInfo = container_info(self._container, self.path)
        except Exception as e:
            self._container.close()
            if isinstance(e, SourceError):
                raise
            raise SourceError(self.path, f"corrupt or truncated video ({type(e).__name__}: {e})") from None
        self._stream = self._container.streams.video[0]
        cc = self._stream.codec_context
        cc.thread_count = max(0, int(threads))  # 0 lets FFmpeg choose
        cc.options = {**cc.options, "err_detect": STRICT_ERR_DETECT}
        self._stream.thread_type = "AUTO"
        tb = self._stream.time_base
        self._tb = float(tb)
        self._start = float(self._stream.start_time * tb) if self._stream.start_time is not None else 0.0

    def _index(self, frame) -> int:
        t = (frame.pts * self._tb if frame.pts is not None else frame.time) - self._start
        return int(round(t * self.info.fps))

    def _frames_from(self, start: int) -> Iterator[tuple[int, object]]:
        import av

        if start > 0:
            ts = int((self._start + (start - 0.5) / self.info.fps) / self._tb)
            self._container.seek(max(ts, 0), stream=self._stream, backward=True, any_frame=False)
        else:
            self._container.seek(0, stream=self._stream, backward=True, any_frame=False)
        last = start - 1
        try:
            for frame in self._container.decode(self._stream):
                i = self._index(frame)
                if frame.is_corrupt:
                    raise SourceError(self.path, f"decode error at frame {i}: FFmpeg marks the frame corrupt")
                last = i
                yield i, frame
        except av.FFmpegError as e:
            raise SourceError(self.path, f"corrupt or truncated video: decode error after frame {last} ({e})") from None

    def iter_frames(self, start: int, stop: int) -> Iterator[np.ndarray]:
        for i, frame in self._frames_from(start):
            if i < start:
                continue
            if i >= stop:
                break
            yield frame.to_ndarray(format="rgb24")

    def read_range(self, start: int, stop: int, chunk: int = 16) -> Iterator[np.ndarray]:
        buf: list[np.ndarray] = []
        for f in self.iter_frames(start, stop):
            buf.append(f)
            if len(buf) == chunk:
                yield np.stack(buf)
                buf = []
        if buf:
            yield np.stack(buf)

    def get_frames(self, indices: Sequence[int]) -> np.ndarray:
        idx = frame_indices_check(indices, self.info.num_frames, self.path)
        out: dict[int, np.ndarray] = {}
        # decode sorted runs: one seek per gap, sequential decode inside a run
        for i in sorted(set(idx)):
            if i in out:
                continue
            for j, frame in self._frames_from(i):
                if j >= i:
                    out[j] = frame.to_ndarray(format="rgb24")
                    break
            if i not in out:
                raise IndexError(f"{self.path}: frame {i} could not be decoded")
        return np.stack([out[i] for i in idx])

    def close(self) -> None:
        self._container.close()


def open_video(path: str | Path, *, threads: int = 1, seek_mode: str = "exact") -> PyAVDecoder:
    return PyAVDecoder(Path(path), threads)

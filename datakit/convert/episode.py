"""Convert one episode: load its table, decode every camera in lock-step, resize, detect each camera's status,
pack the colour layout, and append its frames (tar members, frame-major) to the open shard.
An episode that fails half-way is rolled back, so the shard never holds part of an episode.
"""
from __future__ import annotations

import io
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np
import torch

from datakit.convert.config import ConvertConfig
from datakit.decoders import BackendUnavailable, VideoInfo, open_decoder
from datakit.errors import DatakitError, OutputError, SourceError
from datakit.shards.writer import FrameWriter, ShardFile
from datakit.sources import load_episode
from datakit.sources.checks import check_episode_table, raise_first_error
from datakit.sources.episode import DatasetSpec, EpisodeRef, EpisodeTable, VideoSlice, task_text
from datakit.stages.colour import rgb_to_nv12
from datakit.stages.background import in_background
from datakit.stages.resize import resize_frames
from datakit.stages.camera_status import StatusDetector

@dataclass
class EpisodeResult:
    """What the main process needs to place an episode in a shard and in the index."""

    episode_index: int
    source: str
    error: DatakitError | None = None  # why the episode was not written (bad input), else None
    length: int = 0
    task: str = ""
    nbytes: int = 0  # bytes of tar members written for this episode
    camera_status: dict[str, str] = field(default_factory=dict)  # camera -> real | blank | missing
    offsets: dict[str, np.ndarray] = field(default_factory=dict)  # relative to `base`, -1 missing
    frame_index: np.ndarray | None = None
    timestamp: np.ndarray | None = None
    task_index: np.ndarray | None = None
    state: np.ndarray | None = None
    action: np.ndarray | None = None
    decoders: dict[str, str] = field(default_factory=dict)  # camera -> backend used
    base: int = -1  # offset in the shard where this episode's members start
    trace: str = ""  # traceback of the error, for --debug (tracebacks do not cross processes)


class FrameStream:
    """One camera's frames, pulled one at a time in lock-step with the other cameras; a stream
    that ends exactly one frame early repeats its last frame (tolerated timing slack)."""

    def __init__(self, frames: Iterator[np.ndarray], where: Path):
        self._frames = frames
        self.where = where
        self.count = 0
        self.last: np.ndarray | None = None

    def next(self, length: int) -> np.ndarray:
        f = next(self._frames, None)
        if f is None:
            if length - self.count > 1 or self.last is None:
                raise SourceError(self.where, f"video shorter than the table ({self.count} frames, table says {length})")
            return self.last
        self.count += 1
        self.last = f
        return f

    def extra(self, limit: int) -> int:
        """Frames left after the table's length (up to `limit`), to detect a longer video."""
        n = 0
        for _ in self._frames:
            n += 1
            if n >= limit:
                break
        return n


def _video_frames(cam: str, vs: VideoSlice, spec: DatasetSpec, length: int, cfg: ConvertConfig,
                  used: dict[str, str]) -> Iterator[np.ndarray]:
    try:  # the decoder's own metadata is the probe (one open of the file, not two)
        dec = open_decoder(vs.path, cfg.decoder, threads=cfg.decoder_threads)
    except BackendUnavailable as e:
        raise SourceError(vs.path, str(e)) from None
    try:
        start, stop = _frame_range(cam, vs, spec, length, dec.info)
        used[cam] = dec.backend
        for i, frame in enumerate(dec.iter_frames(start, stop)):
            _check_frame_size(frame, spec.cameras[cam].height, spec.cameras[cam].width, vs.path, f"frame {i}")
            yield resize_frames(frame[None], cfg.size)[0] if cfg.size else frame
    except DatakitError:
        raise
    except Exception as e:
        raise SourceError(vs.path, f"corrupt or truncated video ({type(e).__name__}: {e})") from None
    finally:
        dec.close()


def _frame_range(cam: str, vs: VideoSlice, spec: DatasetSpec, length: int, info: VideoInfo) -> tuple[int, int]:
    """The frames [start, stop) of the video that hold the episode, after checking the video's fps,
    frame size and length against the dataset's declaration (each mismatch is bad input)."""
    if abs(info.fps - spec.fps) > 0.01 * spec.fps:
        raise SourceError(vs.path, f"fps {info.fps:g} does not match the dataset's {spec.fps:g}")
    declared = spec.cameras[cam]
    if (info.height, info.width) != (declared.height, declared.width):
        raise SourceError(vs.path, f"frame size {info.height}x{info.width} differs from the declared "
                                   f"{declared.height}x{declared.width}")
    start = int(round(vs.from_timestamp * spec.fps))
    if vs.to_timestamp is None:  # a whole file holds the episode: count its frames too
        if abs(info.num_frames - length) > 1:
            word = "shorter" if info.num_frames < length else "longer"
            raise SourceError(vs.path, f"video {word} than the table ({info.num_frames} frames, table says {length})")
        return start, start + length + 2
    n_slice = int(round((vs.to_timestamp - vs.from_timestamp) * spec.fps))
    if abs(n_slice - length) > 1:
        raise SourceError(vs.path, f"episode time range holds {n_slice} frames, table says {length}")
    return start, start + min(n_slice, length)


def _check_frame_size(frame: np.ndarray, height: int, width: int, where: Path, what: str) -> None:
    """A frame of another size than the declared one would be written under the declared shape
    in the index (readers would slice wrong bytes): bad input."""
    if frame.shape != (height, width, 3):
        raise SourceError(where, f"{what} is {frame.shape[0]}x{frame.shape[1]}, the dataset declares {height}x{width}")


def _image_frames(cam: str, images: list[bytes], cfg: ConvertConfig, source: Path,
                  declared: tuple[int, int]) -> Iterator[np.ndarray]:
    from PIL import Image

    for i, b in enumerate(images):
        try:
            frame = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
        except Exception as e:
            raise SourceError(source, f"unreadable image in column {cam} at frame {i} ({e})") from None
        _check_frame_size(frame, *declared, source, f"image column {cam} frame {i}")
        yield resize_frames(frame[None], cfg.size)[0] if cfg.size else frame


def _write_episode(spec: DatasetSpec, ref: EpisodeRef, table: EpisodeTable, cfg: ConvertConfig,
                   sink: BinaryIO | ShardFile, res: EpisodeResult, progress: Callable[[int], None]) -> None:
    T = len(table)
    streams: dict[str, FrameStream] = {}
    for cam in spec.cameras:
        if cam in table.images:
            declared = (spec.cameras[cam].height, spec.cameras[cam].width)
            frames = _image_frames(cam, table.images[cam], cfg, ref.source, declared)
            streams[cam] = FrameStream(in_background(frames, name=cam) if cfg.use_camera_threads else frames, ref.source)
        elif ref.videos.get(cam) is not None:
            vs = ref.videos[cam]
            frames = _video_frames(cam, vs, spec, T, cfg, res.decoders)
            streams[cam] = FrameStream(in_background(frames, name=cam) if cfg.use_camera_threads else frames, vs.path)
    detectors = {cam: StatusDetector() for cam in streams}
    res.offsets = {cam: np.full(T, -1, np.int64) for cam in spec.cameras}
    writer = FrameWriter(sink)
    state, action = table.state, table.action  # float32 since the checks
    for t in range(T):
        images: dict[str, np.ndarray] = {}
        for cam, s in streams.items():
            frame = s.next(T)
            detectors[cam].update(frame[None])
            images[cam] = rgb_to_nv12(torch.from_numpy(frame[None]))[0].numpy() if cfg.layout == "nv12" else frame
        task_index = int(table.task_index[t])
        meta = {"episode_index": ref.episode_index, "frame_index": int(table.frame_index[t]),
                "timestamp": float(table.timestamp[t]), "task_index": task_index,
                "task": task_text(spec.tasks, task_index)}
        offs = writer.write_frame(ref.episode_index, int(table.frame_index[t]), images, state[t], action[t], meta)
        for cam, o in offs.items():
            res.offsets[cam][t] = o
        progress(1)
    for cam, s in streams.items():
        vs = ref.videos.get(cam)
        if vs is not None and vs.to_timestamp is None and (extra := s.extra(2)) >= 2:
            raise SourceError(vs.path, f"video longer than the table (at least {s.count + extra} frames, table says {T})")
    res.camera_status = {cam: (detectors[cam].status if cam in detectors else "missing") for cam in spec.cameras}
    res.nbytes = writer.pos


def convert_episode(spec: DatasetSpec, ref: EpisodeRef, cfg: ConvertConfig, sink: ShardFile,
                    progress: Callable[[int], None] = lambda n: None) -> EpisodeResult:
    """Append one episode to the open shard `sink`. A bad input comes back in `.error` (a
    DatakitError naming the file; nothing written); an OutputError (the sink failed: disk full,
    read-only OUT) is raised, since skipping the episode cannot help. `progress(n)` hears of
    every frame written, and of the rest of `ref.length` once the episode is done or failed."""
    res = EpisodeResult(ref.episode_index, str(ref.source), base=sink.bytes)
    counted = 0

    def frame_done(n: int) -> None:
        nonlocal counted
        counted += n
        progress(n)

    try:
        return _convert(spec, ref, cfg, sink, res, frame_done)
    finally:
        if ref.length > counted:
            progress(ref.length - counted)


def _convert(spec: DatasetSpec, ref: EpisodeRef, cfg: ConvertConfig, sink: ShardFile, res: EpisodeResult,
             progress: Callable[[int], None]) -> EpisodeResult:
    try:
        table = load_episode(spec, ref)
        raise_first_error(check_episode_table(spec, ref, table, nonfinite=getattr(cfg, "nonfinite", "reject")))
        with np.errstate(over="ignore"):  # kept (nonfinite="keep") values beyond float32 become +-inf
            table.state, table.action = table.state.astype(np.float32), table.action.astype(np.float32)
        try:
            _write_episode(spec, ref, table, cfg, sink, res, progress)
        except BaseException:
            sink.truncate(res.base)
            raise
        res.length, res.task = len(table), table.task
        res.frame_index, res.timestamp, res.task_index = table.frame_index, table.timestamp, table.task_index
        res.state, res.action = table.state, table.action
    except OutputError:
        raise
    except DatakitError as e:
        res.error = e
        res.trace = traceback.format_exc()
    except Exception as e:  # an unforeseen failure still names the episode, with the trace kept
        res.error = SourceError(ref.source, f"{type(e).__name__}: {e}")
        res.error.__cause__ = e
        res.trace = traceback.format_exc()
    return res

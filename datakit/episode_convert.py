"""Convert one episode: load its table, decode every camera in lock-step, resize, detect slots,
pack the colour layout, and write its frames as a tar fragment (run inside a worker process).

Output goes to a temporary name and is renamed when complete, with a small result file beside
it, so a rerun after a crash reuses finished episodes and redoes only the interrupted one.
"""
from __future__ import annotations

import io
import os
import pickle
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from datakit.config import ConvertConfig
from datakit.decoders import BackendUnavailable, open_decoder, probe_video
from datakit.errors import DatakitError, SourceError
from datakit.shards.writer import FragmentWriter
from datakit.sources import load_episode
from datakit.sources.episode import DatasetSpec, EpisodeRef, EpisodeTable, VideoSlice
from datakit.stages.colour import rgb_to_nv12
from datakit.stages.resize import resize_frames
from datakit.stages.slots import SlotDetector

CHUNK = 16  # frames per decode/resize/pack step: large enough to vectorise, small for memory


@dataclass
class EpisodeResult:
    """What the main process needs to place an episode in a shard and in the index."""

    episode_index: int
    source: str
    error: str | None = None
    length: int = 0
    task: str = ""
    fragment: str = ""  # file name in the staging folder
    fragment_bytes: int = 0
    slots: dict[str, str] = field(default_factory=dict)
    offsets: dict[str, np.ndarray] = field(default_factory=dict)  # relative to the fragment, -1 missing
    frame_index: np.ndarray | None = None
    timestamp: np.ndarray | None = None
    task_index: np.ndarray | None = None
    state: np.ndarray | None = None
    action: np.ndarray | None = None
    decoders: dict[str, str] = field(default_factory=dict)  # camera -> backend used


def staging_names(episode_index: int) -> tuple[str, str]:
    return f"ep-{episode_index:06d}.frag", f"ep-{episode_index:06d}.result"


class FrameStream:
    """A camera's frames as fixed-size takes, whatever chunk sizes the source yields."""

    def __init__(self, chunks: Iterator[np.ndarray]):
        self._chunks = chunks
        self._buf: list[np.ndarray] = []
        self._have = 0
        self.count = 0  # frames handed out so far
        self.last: np.ndarray | None = None

    def take(self, n: int) -> np.ndarray | None:
        while self._have < n:
            nxt = next(self._chunks, None)
            if nxt is None:
                break
            self._buf.append(nxt)
            self._have += len(nxt)
        if not self._have:
            return None
        allf = np.concatenate(self._buf) if len(self._buf) > 1 else self._buf[0]
        out, rest = allf[:n], allf[n:]
        self._buf, self._have = ([rest] if len(rest) else []), len(rest)
        self.count += len(out)
        self.last = out[-1]
        return out

    def drain(self, limit: int) -> int:
        """Count the frames left (up to `limit`) without keeping them."""
        extra = self._have
        for c in self._chunks:
            extra += len(c)
            if extra >= limit:
                break
        return extra


def _video_chunks(cam: str, vs: VideoSlice, spec: DatasetSpec, length: int, cfg: ConvertConfig,
                  used: dict[str, str]) -> Iterator[np.ndarray]:
    info = probe_video(vs.path)
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
        stop = start + length + 2
    else:
        n_slice = int(round((vs.to_timestamp - vs.from_timestamp) * spec.fps))
        if abs(n_slice - length) > 1:
            raise SourceError(vs.path, f"episode time range holds {n_slice} frames, table says {length}")
        stop = start + min(n_slice, length)
    try:
        dec = open_decoder(vs.path, cfg.decoder, threads=cfg.decoder_threads)
    except BackendUnavailable as e:
        raise SourceError(vs.path, str(e)) from None
    used[cam] = dec.backend
    try:
        for chunk in dec.read_range(start, stop, chunk=CHUNK):
            yield resize_frames(chunk, cfg.size) if cfg.size else chunk
    except DatakitError:
        raise
    except Exception as e:
        raise SourceError(vs.path, f"corrupt or truncated video ({type(e).__name__}: {e})") from None
    finally:
        dec.close()


def _image_chunks(cam: str, images: list[bytes], cfg: ConvertConfig, source: Path) -> Iterator[np.ndarray]:
    from PIL import Image

    for a in range(0, len(images), CHUNK):
        try:
            batch = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in images[a : a + CHUNK]])
        except Exception as e:
            raise SourceError(source, f"unreadable image in column {cam} ({e})") from None
        yield resize_frames(batch, cfg.size) if cfg.size else batch


def _write_episode(spec: DatasetSpec, ref: EpisodeRef, table: EpisodeTable, cfg: ConvertConfig,
                   frag: io.BufferedWriter, res: EpisodeResult) -> None:
    T = len(table)
    streams: dict[str, FrameStream] = {}
    for cam in spec.cameras:
        if cam in table.images:
            streams[cam] = FrameStream(_image_chunks(cam, table.images[cam], cfg, ref.source))
        elif ref.videos.get(cam) is not None:
            streams[cam] = FrameStream(_video_chunks(cam, ref.videos[cam], spec, T, cfg, res.decoders))
    detectors = {cam: SlotDetector() for cam in streams}
    res.offsets = {cam: np.full(T, -1, np.int64) for cam in spec.cameras}
    writer = FragmentWriter(frag)
    for t0 in range(0, T, CHUNK):
        n = min(CHUNK, T - t0)
        packed: dict[str, np.ndarray] = {}
        for cam, s in streams.items():
            frames = s.take(n)
            got = 0 if frames is None else len(frames)
            if got < n:
                if T - s.count > 1 or s.last is None:  # the stream has ended more than one frame short
                    where = ref.videos[cam].path if ref.videos.get(cam) else ref.source
                    raise SourceError(where, f"video shorter than the table ({s.count} frames, table says {T})")
                pad = np.repeat(s.last[None], n - got, axis=0)  # one frame short: repeat the last
                frames = pad if frames is None else np.concatenate([frames, pad])
            detectors[cam].update(frames)
            packed[cam] = rgb_to_nv12(torch.from_numpy(frames)).numpy() if cfg.layout == "nv12" else frames
        for i in range(n):
            t = t0 + i
            meta = {"episode_index": ref.episode_index, "frame_index": int(table.frame_index[t]),
                    "timestamp": float(table.timestamp[t]), "task_index": int(table.task_index[t]), "task": table.task}
            offs = writer.write_frame(ref.episode_index, int(table.frame_index[t]),
                                      {c: p[i] for c, p in packed.items()}, table.state[t], table.action[t], meta)
            for cam, o in offs.items():
                res.offsets[cam][t] = o
    for cam, s in streams.items():
        vs = ref.videos.get(cam)
        if vs is not None and vs.to_timestamp is None:
            extra = s.drain(2)
            if extra >= 2:
                raise SourceError(vs.path, f"video longer than the table (at least {s.count + extra} frames, table says {T})")
    res.slots = {cam: (detectors[cam].slot if cam in detectors else "missing") for cam in spec.cameras}
    res.fragment_bytes = writer.pos


def convert_episode(spec: DatasetSpec, ref: EpisodeRef, cfg: ConvertConfig, staging: Path) -> EpisodeResult:
    """Convert (or reuse the finished conversion of) one episode; errors come back in `.error`."""
    frag_name, result_name = staging_names(ref.episode_index)
    result_path = staging / result_name
    if result_path.exists():
        with open(result_path, "rb") as f:
            return pickle.load(f)
    res = EpisodeResult(ref.episode_index, str(ref.source))
    tmp = staging / (frag_name + ".tmp")
    try:
        table = load_episode(spec, ref)
        if len(table) != ref.length:
            raise SourceError(ref.source, f"table has {len(table)} rows, metadata says {ref.length}")
        if not np.array_equal(table.frame_index, np.arange(len(table))):
            raise SourceError(ref.source, "frame_index is not 0..length-1 in order")
        with open(tmp, "wb") as frag:
            _write_episode(spec, ref, table, cfg, frag, res)
            frag.flush()
            os.fsync(frag.fileno())
        os.replace(tmp, staging / frag_name)
        res.length, res.task, res.fragment = len(table), table.task, frag_name
        res.frame_index, res.timestamp, res.task_index = table.frame_index, table.timestamp, table.task_index
        res.state, res.action = table.state.astype(np.float32), table.action.astype(np.float32)
    except DatakitError as e:
        res.error = str(e)
    except Exception as e:  # an unforeseen failure still names the episode, with the trace in the log
        res.error = f"{ref.source}: {type(e).__name__}: {e}"
        res.trace = traceback.format_exc()  # type: ignore[attr-defined]
    finally:
        tmp.unlink(missing_ok=True)
    if res.error is None or cfg.on_error == "skip":  # a failure under --on-error fail is retried on rerun
        part = result_path.with_name(result_name + ".tmp")
        with open(part, "wb") as f:
            pickle.dump(res, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, result_path)
    return res

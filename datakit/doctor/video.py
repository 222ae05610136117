"""Audit one camera's video of one episode: decode every frame, without converting anything.

Decoding is done by FFmpeg through PyAV, packet by packet, because it is the one decoder that says
*which* frame went wrong: a packet it cannot decode raises, and a frame it concealed (damaged
bytes that still give a picture, the silent case of issue 7) carries `is_corrupt`. Decord and
TorchCodec return such frames without a word. A decode error does not end the audit; the packets
after it are still decoded, so the count of frames and later defects are still reported.

What is reported (all with the episode's frame number, 0 = the episode's first frame):
- `video_unreadable`: the container cannot be opened or has no video stream
- `video_fps`, `video_size`: the stream disagrees with the dataset's fps or declared frame size
- `video_decode_error`: a packet that FFmpeg cannot decode; `video_corrupt_frame`: a concealed frame
- `video_frame_count`: decoded frames differ from the table's length (or from the container's count)
- `video_timestamps`: presentation times that skip frames, repeat or go backwards
- `blank_camera`: every frame constant (the `stages.slots` rule), `frozen_camera`: a long run of
  identical frames (mean absolute difference at most FROZEN_MEAN_DIFF levels)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datakit.decoders import probe_video
from datakit.errors import SourceError
from datakit.sources.checks import ERROR, WARNING, Finding
from datakit.shards.index import SLOT_BLANK
from datakit.sources.episode import DatasetSpec, EpisodeRef, VideoSlice
from datakit.stages.slots import SlotDetector

# Mean absolute difference (uint8 levels, every 2nd pixel) at or below which two consecutive frames
# count as identical. A frozen H.264 source decodes with differences of 0.05-0.45 (codec noise);
# a moving scene differs by 10 or more.
FROZEN_MEAN_DIFF = 0.75
# decode and corruption findings listed one by one per video; the rest are summed up in one more
MAX_FRAME_FINDINGS = 5


@dataclass(frozen=True)
class VideoAuditOptions:
    """What counts as a frozen camera."""

    frozen_frames: int = 30  # a run of at least this many identical frames is reported


class _FrameTracker:
    """Follows decoded frames in order: timestamp steps, blank content and frozen runs."""

    def __init__(self, cam: str, path: str, ref: EpisodeRef, opts: VideoAuditOptions):
        self.cam, self.path, self.episode, self.opts = cam, path, ref.episode_index, opts
        self.findings: list[Finding] = []
        self.count = 0
        self.last_index: int | None = None
        self.slot = SlotDetector()
        self._prev: np.ndarray | None = None
        self._run_start = 0
        self._run = 0

    def add(self, kind: str, frame: int | None, msg: str, severity: str = ERROR) -> None:
        self.findings.append(Finding(kind, self.path, f"episode {self.episode} camera {self.cam}: {msg}",
                                     self.episode, frame, severity))

    def frame(self, index: int, rgb: np.ndarray) -> None:
        if self.last_index is not None and index != self.last_index + 1:
            if index <= self.last_index:
                self.add("video_timestamps", index, f"frame {index} is presented at or before frame "
                                                     f"{self.last_index} (timestamps repeat or go backwards)")
            else:
                self.add("video_timestamps", self.last_index + 1,
                          f"{index - self.last_index - 1} frame(s) missing before frame {index} (timestamp gap)")
        self.last_index = index
        self.count += 1
        self.slot.update(rgb[None])
        sub = rgb[::2, ::2].astype(np.int16)
        if self._prev is not None and np.abs(sub - self._prev).mean() <= FROZEN_MEAN_DIFF:
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
        if self.count and self.slot.slot == SLOT_BLANK:
            self.add("blank_camera", 0, f"all {self.count} frames are one constant colour (a blank camera)",
                      WARNING)
        elif self.count:
            self._end_run()


def _frame_range(vs: VideoSlice, spec: DatasetSpec) -> tuple[int, int | None]:
    """[start, stop) of the episode in the file's frame numbers; stop None = up to the end."""
    start = int(round(vs.from_timestamp * spec.fps))
    stop = None if vs.to_timestamp is None else int(round(vs.to_timestamp * spec.fps))
    return start, stop


def _decode(vs: VideoSlice, fps: float, start: int, stop: int | None, tracker: _FrameTracker) -> list[tuple[int, str]]:
    """Decode the packets of [start, stop); feed every frame to the tracker; return the decode
    errors and concealed frames as (episode frame, what)."""
    import av

    bad: list[tuple[int, str]] = []
    with av.open(str(vs.path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        tb = float(stream.time_base)
        t0 = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        if start > 0:
            container.seek(max(int((t0 + (start - 0.5) / fps) / tb), 0), stream=stream, backward=True)
        done = False
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.FFmpegError as e:
                nxt = (tracker.last_index + 1) if tracker.last_index is not None else 0
                bad.append((nxt, f"decode error ({type(e).__name__}: {e})"))
                continue
            for frame in frames:
                t = (frame.pts * tb if frame.pts is not None else frame.time) - t0
                i = int(round(t * fps)) - start
                if i < 0:
                    continue
                if stop is not None and i >= stop - start:
                    done = True
                    break
                if frame.is_corrupt:
                    bad.append((i, "frame decoded with errors (concealed damage)"))
                tracker.frame(i, frame.to_ndarray(format="rgb24"))
            if done:
                break
    return bad


def _bad_frame_findings(bad: list[tuple[int, str]], tracker: _FrameTracker) -> None:
    for frame, what in bad[:MAX_FRAME_FINDINGS]:
        kind = "video_decode_error" if what.startswith("decode error") else "video_corrupt_frame"
        tracker.add(kind, frame, f"frame {frame}: {what}")
    if len(bad) > MAX_FRAME_FINDINGS:
        rest = bad[MAX_FRAME_FINDINGS:]
        tracker.add("video_corrupt_frame", rest[0][0], f"{len(rest)} more damaged frame(s) from frame {rest[0][0]}")


def audit_video(spec: DatasetSpec, ref: EpisodeRef, cam: str, vs: VideoSlice,
                opts: VideoAuditOptions) -> tuple[list[Finding], int]:
    """Findings for one camera of one episode, and the number of frames decoded."""
    path = str(vs.path)
    tracker = _FrameTracker(cam, path, ref, opts)
    try:
        info = probe_video(vs.path)
    except SourceError as e:
        tracker.add("video_unreadable", None, e.problem)
        return tracker.findings, 0
    if abs(info.fps - spec.fps) > 0.01 * spec.fps:
        tracker.add("video_fps", None, f"video fps {info.fps:g} differs from the dataset's {spec.fps:g}")
    declared = spec.cameras.get(cam)
    if declared is not None and (info.height, info.width) != (declared.height, declared.width):
        tracker.add("video_size", None, f"frame size {info.height}x{info.width} differs from the declared "
                                         f"{declared.height}x{declared.width}")
    start, stop = _frame_range(vs, spec)
    try:
        bad = _decode(vs, spec.fps, start, stop, tracker)
    except Exception as e:  # av raises many types for damaged containers; the audit goes on
        nxt = (tracker.last_index + 1) if tracker.last_index is not None else 0
        bad = [(nxt, f"decode error ({type(e).__name__}: {e})")]
    _bad_frame_findings(bad, tracker)
    tracker.finish()
    if tracker.count != ref.length:
        word = "fewer" if tracker.count < ref.length else "more"
        sev = WARNING if abs(tracker.count - ref.length) == 1 else ERROR  # convert tolerates one frame
        tracker.add("video_frame_count", min(tracker.count, ref.length),
                     f"{tracker.count} frames decoded, {word} than the table's {ref.length}", sev)
    elif stop is None and info.num_frames != tracker.count:
        tracker.add("video_frame_count", None, f"the container declares {info.num_frames} frames but "
                                                f"{tracker.count} decode", WARNING)
    return tracker.findings, tracker.count


__all__ = ["FROZEN_MEAN_DIFF", "MAX_FRAME_FINDINGS", "VideoAuditOptions", "audit_video"]

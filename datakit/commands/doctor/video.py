"""Audit one camera's video of one episode: decode every frame, without converting anything.

Decoding is done by FFmpeg through PyAV, packet by packet on one thread, because that says *which*
frame went wrong: the packets tell which frames the file holds (their presentation times), a
packet FFmpeg cannot decode raises at that packet, and a frame it concealed (damaged bytes that
still give a picture, the silent case of issue 7) carries `is_corrupt`. Decord and TorchCodec
return such frames without a word. A decode error does not end the audit; the packets after it
are still decoded, so the frame count and later defects are still reported. Damage that FFmpeg
itself does not notice (bytes flipped in a way that still parses) cannot be seen here either:
with `synth.damage.flip_frame_bytes` (8 bytes in one frame, seeds 0-19, 30-frame 64x96 videos)
every AV1 case was reported and 12 of 20 H.264 cases; in the other 8 the picture is visibly wrong
but FFmpeg raises, flags and logs nothing (its `err_detect` flags change none of them).

What is reported (all with the episode's frame number, 0 = the episode's first frame):
- `video_unreadable`: the container cannot be opened or has no video stream
- `video_fps`, `video_size`: the stream disagrees with the dataset's fps or declared frame size
- `video_decode_error`: a frame the file holds that does not decode (or whose packet raised);
  `video_corrupt_frame`: a frame FFmpeg decoded by concealing damage
- `video_frame_count`: decoded frames differ from the table's length (or from the container's count)
- `video_timestamps`: packet presentation times that skip frames or repeat, decode times that
  go backwards
- `blank_camera`, `frozen_camera`: see `datakit.commands.doctor.frames`
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from datakit.decoders import probe_video
from datakit.commands.doctor.frames import CameraTracker, FrameAuditOptions
from datakit.errors import SourceError
from datakit.sources.checks import ERROR, WARNING, Finding
from datakit.sources.episode import DatasetSpec, EpisodeRef, VideoSlice

# decode and corruption findings listed one by one per video; the rest are summed up in one more
MAX_FRAME_FINDINGS = 5


@dataclass
class _Packets:
    """What the container holds for the episode, packet by packet (before any decoding)."""

    frames: list[int] = field(default_factory=list)  # episode frame number of each packet, demux order
    dts_backwards: list[int] = field(default_factory=list)  # frames whose packet dts does not increase
    errors: dict[int, str] = field(default_factory=dict)  # frame -> decode error raised at its packet
    corrupt: list[int] = field(default_factory=list)  # frames decoded with concealed damage


def _frame_range(vs: VideoSlice, spec: DatasetSpec) -> tuple[int, int | None]:
    """[start, stop) of the episode in the file's frame numbers; stop None = up to the end."""
    start = int(round(vs.from_timestamp * spec.fps))
    stop = None if vs.to_timestamp is None else int(round(vs.to_timestamp * spec.fps))
    return start, stop


# packets demuxed past the episode's end before stopping (B-frame reordering depth, generously)
REORDER_MARGIN = 32


# pixel formats whose first plane is 8-bit luma, readable without any conversion
_LUMA_FIRST = frozenset({"yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "nv12", "gray"})


def _luma(frame) -> np.ndarray:
    """The frame's 8-bit luma plane as an (H, W) view of the decoder's buffer, else converted."""
    if frame.format.name in _LUMA_FIRST:
        plane = frame.planes[0]
        return np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, :frame.width]
    return frame.to_ndarray(format="gray")


def _decode(vs: VideoSlice, fps: float, start: int, stop: int | None, tracker: CameraTracker,
            got: _Packets) -> None:
    """Demux and decode the packets of [start, stop) one by one, feeding every frame to the tracker
    and recording packets, errors and concealed frames in `got` (kept if the demuxer fails later)."""
    import av

    n = None if stop is None else stop - start
    with av.open(str(vs.path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1  # errors surface at the packet that carries them
        tb = float(stream.time_base)
        t0 = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        if start > 0:
            container.seek(max(int((t0 + (start - 0.5) / fps) / tb), 0), stream=stream, backward=True)

        def index(ts: float) -> int:  # episode frame number of a presentation time in time_base units
            return int(round((ts * tb - t0) * fps)) - start

        def wanted(i: int) -> bool:
            return i >= 0 and (n is None or i < n)

        last_dts = None
        for packet in container.demux(stream):
            if packet.pts is not None:  # the flush packet at the end has none
                i = index(packet.pts)
                if n is not None and packet.dts is not None and index(packet.dts) >= n + REORDER_MARGIN:
                    break
                if wanted(i):
                    got.frames.append(i)
                    if last_dts is not None and packet.dts is not None and packet.dts <= last_dts:
                        got.dts_backwards.append(i)
                last_dts = packet.dts if packet.dts is not None else last_dts
            try:
                frames = packet.decode()
            except av.FFmpegError as e:
                if packet.pts is not None and wanted(index(packet.pts)):
                    got.errors[index(packet.pts)] = f"{type(e).__name__}: {e}"
                continue
            for frame in frames:
                i = index(frame.pts) if frame.pts is not None else int(round((frame.time - t0) * fps)) - start
                if wanted(i):
                    if frame.is_corrupt:
                        got.corrupt.append(i)
                    tracker.frame(i, _luma(frame), lambda f=frame: f.to_ndarray(format="rgb24"))


def _listed(frames: list[int]) -> str:
    shown = ", ".join(str(i) for i in frames[:MAX_FRAME_FINDINGS])
    return shown + (f" and {len(frames) - MAX_FRAME_FINDINGS} more" if len(frames) > MAX_FRAME_FINDINGS else "")


def _packet_findings(got: _Packets, tracker: CameraTracker) -> None:
    """Decode errors, concealed frames and timestamp defects, each pinned to a frame; per kind at
    most MAX_FRAME_FINDINGS findings, then one that counts the rest."""
    def report(kind: str, frames: list[int], what) -> None:
        for i in frames[:MAX_FRAME_FINDINGS]:
            tracker.add(kind, i, f"frame {i}: {what(i)}")
        if len(frames) > MAX_FRAME_FINDINGS:
            rest = frames[MAX_FRAME_FINDINGS:]
            tracker.add(kind, rest[0], f"{len(rest)} more such frames from frame {rest[0]} ({_listed(rest)})")

    present = sorted(set(got.frames))
    lost = [i for i in present if i not in tracker.decoded]
    first_error = next(iter(got.errors.values()), "no frame came out of the decoder")
    report("video_decode_error", lost, lambda i: f"does not decode ({got.errors.get(i, first_error)})")
    quiet = sorted(i for i in got.errors if i in tracker.decoded)  # an error, yet a frame came out
    report("video_decode_error", quiet, lambda i: f"decode error ({got.errors[i]})")
    report("video_corrupt_frame", sorted(set(got.corrupt)), lambda i: "decoded with errors (concealed damage)")
    repeated = sorted(i for i, k in Counter(got.frames).items() if k > 1)
    report("video_timestamps", repeated, lambda i: "two packets have this presentation time")
    report("video_timestamps", got.dts_backwards, lambda i: "decode timestamp does not increase (goes backwards)")
    gaps = [a + 1 for a, b in zip(present, present[1:]) if b > a + 1]
    ends = {a + 1: b for a, b in zip(present, present[1:]) if b > a + 1}
    report("video_timestamps", gaps, lambda i: f"{ends[i] - i} frame(s) missing before frame {ends[i]} "
                                               f"(a timestamp gap)")


def audit_video(spec: DatasetSpec, ref: EpisodeRef, cam: str, vs: VideoSlice,
                opts: FrameAuditOptions) -> tuple[list[Finding], int]:
    """Findings for one camera of one episode, and the number of frames decoded."""
    path = str(vs.path)
    tracker = CameraTracker(cam, path, ref, opts)
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
    got = _Packets()
    try:
        _decode(vs, spec.fps, start, stop, tracker, got)
    except Exception as e:  # the demuxer gave up (e.g. a truncated file): report where, audit the rest
        at = max([*tracker.decoded, *got.frames], default=-1) + 1
        tracker.add("video_decode_error", at, f"frame {at}: the file cannot be read past this point "
                                              f"({type(e).__name__}: {e})")
    _packet_findings(got, tracker)
    tracker.finish()
    packets = len(set(got.frames))
    short = (f"; the file holds {packets} of the {info.num_frames} frames its index lists (truncated?)"
             if stop is None and packets < info.num_frames else "")
    if tracker.count != ref.length:
        word = "fewer" if tracker.count < ref.length else "more"
        sev = WARNING if abs(tracker.count - ref.length) == 1 else ERROR  # convert tolerates one frame
        tracker.add("video_frame_count", min(tracker.count, ref.length),
                    f"{tracker.count} frames decoded, {word} than the table's {ref.length}{short}", sev)
    elif stop is None and info.num_frames != tracker.count:
        tracker.add("video_frame_count", None, f"the container declares {info.num_frames} frames but "
                                               f"{tracker.count} decode", WARNING)
    return tracker.findings, tracker.count


__all__ = ["MAX_FRAME_FINDINGS", "audit_video"]

"""The videos a benchmark runs on: generated ones (cached on disk) or the user's own files.

Generated videos follow what robot datasets actually store: H.264 with the encoder's default
GOP (what most cameras and ffmpeg defaults give), H.264 with g=2 and AV1 with LeRobot's
settings (libsvtav1, yuv420p, g=2, crf=30), at DROID's 180x320, 480x640 and 720p. Every
generated frame carries its frame number as a barcode (`datakit.synth.video`), which is how
the benchmark proves a decoder returned the frame it was asked for. User files are checked
for the same barcode, so datasets made by `datakit.synth` are verified too.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from datakit.decoders.base import probe_video


@dataclass(frozen=True)
class VideoSpec:
    """One generated test video. `gop=None` keeps the encoder's default GOP (x264: 250)."""

    codec: str  # "h264" or "av1"
    height: int
    width: int
    gop: int | None = None
    frames: int = 300  # 10 s at 30 fps: one typical episode
    fps: float = 30.0

    @property
    def name(self) -> str:
        g = "gdef" if self.gop is None else f"g{self.gop}"
        return f"{self.codec}-{g}-{self.height}x{self.width}-{self.frames}f"


@dataclass(frozen=True)
class BenchVideo:
    """A video under test. `views` are the files a multi-view sample reads at one timestep
    (the cameras of one episode; for generated videos the same file stands in for each)."""

    path: Path
    label: str
    codec: str
    height: int
    width: int
    num_frames: int
    fps: float
    gop: int | None = None  # None: unknown or encoder default
    numbered: bool = False  # frames carry their frame number (correctness can be checked)
    views: tuple[Path, ...] = field(default=())


SIZES = {"180x320": (180, 320), "480x640": (480, 640), "720p": (720, 1280)}
# codec settings: (codec, gop)
CODECS = {"h264": ("h264", None), "h264-g2": ("h264", 2), "av1": ("av1", 2)}
N_VIEWS = 3  # Pi0.5-style: three cameras per timestep


def default_specs(sizes: Sequence[str] = tuple(SIZES), codecs: Sequence[str] = tuple(CODECS),
                  frames: int = 300) -> list[VideoSpec]:
    """The cross product of codec settings and sizes, smallest first (fast feedback)."""
    out = []
    for s in sizes:
        if s not in SIZES:
            raise ValueError(f"unknown size {s!r} (supported: {', '.join(SIZES)})")
        for c in codecs:
            if c not in CODECS:
                raise ValueError(f"unknown codec setting {c!r} (supported: {', '.join(CODECS)})")
            codec, gop = CODECS[c]
            out.append(VideoSpec(codec, *SIZES[s], gop=gop, frames=frames))
    return out


def generate(spec: VideoSpec, folder: Path, seed: int = 0) -> BenchVideo:
    """Encode `spec` into `folder` unless an earlier run already did (the name holds every
    setting, and encoding is deterministic, so a cached file is the same video)."""
    from datakit.synth.video import encode_video, synth_frame

    path = Path(folder) / f"{spec.name}.mp4"
    if not path.exists():
        frames = (synth_frame(i, spec.height, spec.width, seed) for i in range(spec.frames))
        crf = 30 if spec.codec == "av1" else None
        encode_video(path, frames, spec.fps, codec=spec.codec, gop=spec.gop, crf=crf)
    info = probe_video(path)
    return BenchVideo(path, spec.name, info.codec, info.height, info.width, info.num_frames, info.fps,
                      gop=spec.gop, numbered=True, views=(path,) * N_VIEWS)


def generate_all(specs: Sequence[VideoSpec], folder: Path,
                 progress: Callable[[str], None] | None = None) -> list[BenchVideo]:
    out = []
    for spec in specs:
        if progress:
            progress(spec.name)
        out.append(generate(spec, folder))
    return out


def carries_frame_numbers(path: Path, probes: int = 3) -> bool:
    """True when the first frames read back as their own frame numbers (a synth video)."""
    import av

    from datakit.synth.video import read_frame_number

    try:
        with av.open(str(path)) as c:
            for i, frame in enumerate(c.decode(video=0)):
                if i >= probes:
                    return True
                if read_frame_number(frame.to_ndarray(format="rgb24")) != i:
                    return False
    except Exception:
        return False
    return False


def from_file(path: Path, views: Sequence[Path] = ()) -> BenchVideo:
    """A user's file as a benchmark video (label from the file name and a short path hash,
    so two `episode_000000.mp4` of different cameras stay apart)."""
    path = Path(path)
    info = probe_video(path)
    tag = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:6]
    label = f"{path.stem}-{tag}-{info.height}x{info.width}"
    v = tuple(Path(p) for p in views) or (path,) * N_VIEWS
    return BenchVideo(path, label, info.codec, info.height, info.width, info.num_frames, info.fps,
                      numbered=carries_frame_numbers(path), views=v)


def from_dataset(root: Path, max_videos: int = 6) -> list[BenchVideo]:
    """Sample videos of a LeRobot / DROID dataset: one file per camera from episodes spread
    over the dataset, each with its episode's other cameras as the multi-view sample.
    LeRobot v3.0 files hold many episodes; the whole file is benchmarked (decoding cost is
    per file position, not per episode)."""
    from datakit.sources import scan

    spec = scan(root)
    eps = [e for e in spec.episodes if any(v is not None for v in e.videos.values())]
    if not eps:
        raise ValueError(f"{root}: no episode with video found")
    out: list[BenchVideo] = []
    seen: set[Path] = set()
    step = max(1, len(eps) // max(1, max_videos))
    for ep in eps[::step]:
        paths = [v.path for v in ep.videos.values() if v is not None]
        for p in paths:
            if p in seen or len(out) >= max_videos:
                continue
            seen.add(p)
            views = (paths * N_VIEWS)[:N_VIEWS]
            out.append(from_file(p, views))
    return out


def collect(paths: Sequence[Path], max_videos: int = 6) -> list[BenchVideo]:
    """`--video` arguments: files are taken as they are, folders are sampled as datasets."""
    out: list[BenchVideo] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(from_dataset(p, max_videos))
        elif p.is_file():
            out.append(from_file(p))
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return out

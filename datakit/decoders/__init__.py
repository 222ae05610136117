"""Decoder registry: every backend behind one signature, chosen by name or "auto".

`open_decoder(path, "auto")` is what conversion uses: it opens the first backend of
`backend_order(codec)` that reads the stream's codec, and falls back to the next one when a
backend is missing or cannot read it. The order is the one that `datakit bench-decoders`
measured on this machine *for conversion-shaped work* (every file opened inside the timing,
every frame in order, 1 thread; see commands/bench_decoders/recommend.py), when its file has one for the
codec; else CONVERT_ORDER, from the project's own conversion measurements. A ranking of decode
alone (decoder opened once and warm) is never used for conversion: it ranked Decord first on
2 cores, where Decord converted 2.2x slower than PyAV (each Decord process pays ~1.4 s before
its first frame, and its "1 thread" keeps 1.25 cores busy).
"""
from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from datakit.decoders.base import BackendUnavailable, VideoDecoder, VideoInfo, probe_video

if TYPE_CHECKING:
    from datakit.sources.episode import DatasetSpec

BACKENDS = {
    "pyav": "datakit.decoders.pyav_backend",
    "decord": "datakit.decoders.decord_backend",
    "torchcodec": "datakit.decoders.torchcodec_backend",
}
# Used for conversion until bench-decoders measures conversion-shaped work on this machine.
# From bench/results/convert.md (2 cores, 480x640 AV1, native and 224x224, every decoder and
# worker count): PyAV converts fastest; it is also the one backend that reports damaged frames
# (docs/convert.md "What decoding cannot catch"). TorchCodec, then Decord, are the fallbacks.
CONVERT_ORDER = ["pyav", "torchcodec", "decord"]
CONVERT_RESULTS = "bench/results/convert.md"

__all__ = [
    "BACKENDS", "BackendUnavailable", "VideoDecoder", "VideoInfo", "probe_video", "CONVERT_ORDER",
    "DecoderChoice", "open_decoder", "backend_order", "backend_module", "decoder_choice", "describe_choice",
    "recommendations_path",
]


def backend_module(name: str) -> ModuleType:
    if name not in BACKENDS:
        raise ValueError(f"unknown decoder {name!r} (supported: auto, {', '.join(BACKENDS)})")
    try:
        return importlib.import_module(BACKENDS[name])
    except Exception as e:
        raise BackendUnavailable(f"{name}: {e}") from None


def recommendations_path() -> Path:
    """Where bench-decoders stores its per-codec ranking (override with DATAKIT_DECODER_RECOMMENDATIONS)."""
    env = os.environ.get("DATAKIT_DECODER_RECOMMENDATIONS")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "datakit" / "decoders.json"


@dataclass(frozen=True)
class DecoderChoice:
    """The backends `--decoder auto` tries for a codec, fastest for conversion first, and why."""

    order: list[str]
    why: str


def decoder_choice(codec: str) -> DecoderChoice:
    """The conversion order for `codec`: this machine's conversion ranking when bench-decoders
    measured one for the codec, else CONVERT_ORDER (the reason says which, and why)."""
    path = recommendations_path()
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = None
    ranked: list[str] = []
    if isinstance(doc, dict):
        conv = doc.get("conversion")
        if isinstance(conv, dict) and isinstance(conv.get(codec), list):
            ranked = [b for b in conv[codec] if isinstance(b, str)]
    if ranked:
        when = doc.get("machine", {}).get("date", "?") if isinstance(doc.get("machine"), dict) else "?"
        why = f"ranked fastest for converting {codec} on this machine by datakit bench-decoders ({path}, {when})"
    elif doc is None:
        why = f"no decoder ranking on this machine ({path}): the project's conversion measurements ({CONVERT_RESULTS})"
    else:
        why = (f"{path} ranks decode alone (decoder opened once, warm), not conversion, for {codec or 'this codec'}: "
               f"the project's conversion measurements ({CONVERT_RESULTS})")
    return DecoderChoice(ranked + [b for b in CONVERT_ORDER if b not in ranked], why)


def backend_order(codec: str) -> list[str]:
    """Backends `--decoder auto` tries for a codec, fastest for conversion first."""
    return decoder_choice(codec).order


def _codecs(spec: "DatasetSpec") -> list[str]:
    """The codecs of the source's videos, from the first video of each camera (a probe each)."""
    firsts: dict[str, Path] = {}
    for ref in spec.episodes:
        for cam, vs in ref.videos.items():
            if vs is not None:
                firsts.setdefault(cam, vs.path)
        if len(firsts) == len(spec.cameras):
            break
    codecs = set()
    for path in firsts.values():
        try:
            codecs.add(probe_video(path).codec)
        except Exception:  # a damaged first file was reported by the conversion itself
            continue
    return sorted(codecs)


def describe_choice(requested: str, used: dict[str, int], spec: "DatasetSpec") -> str:
    """One line for the summary: the decoder(s) used (camera-episodes each), and why."""
    counts = ", ".join(f"{b} ({n} camera-episodes)" for b, n in sorted(used.items(), key=lambda x: -x[1]))
    if requested != "auto":
        return f"{counts or requested}: --decoder {requested}"
    if not used:
        return "auto: no video decoded"
    why = []
    for codec in _codecs(spec):
        choice = decoder_choice(codec)
        fallback = [b for b in used if b != choice.order[0]]
        why.append(f"{codec}: {choice.order[0]} first, {choice.why}"
                   + (f"; {', '.join(fallback)} where {choice.order[0]} could not read a file" if fallback else ""))
    return f"{counts}: auto, " + "; ".join(why)


def open_decoder(path: str | Path, name: str = "auto", *, threads: int = 1, seek_mode: str = "exact") -> VideoDecoder:
    """Open `path` with backend `name`; "auto" tries backends in `backend_order` and falls back."""
    if name != "auto":
        return backend_module(name).open_video(path, threads=threads, seek_mode=seek_mode)
    # PyAV opens the file anyway (its container gives the codec: no separate probe); when the order
    # puts it first it is used as is, without the frame-0 check below: it is the strict reference
    # decoder, and a failure at frame 0 was raised as the file's damage anyway (_raise_if_damaged_start).
    # Both the probe and the check cost a conversion ~12 ms a video (bench/results/convert.md).
    dec = backend_module("pyav").open_video(path, threads=threads, seek_mode=seek_mode)
    codec = dec.info.codec
    order = backend_order(codec)
    if order[0] == "pyav":
        return dec
    dec.close()
    errors = []
    for b in order:
        dec = None
        try:
            dec = backend_module(b).open_video(path, threads=threads, seek_mode=seek_mode)
            # Some failures only show on the first decode (e.g. decord2 3.4 on frame widths that
            # are not a multiple of its alignment), so "can read" means "decoded frame 0 right".
            first = dec.get_frames([0])
            if first.shape != (1, dec.info.height, dec.info.width, 3):
                raise BackendUnavailable(f"{b} returned {first.shape} for a {dec.info.height}x{dec.info.width} video")
            return dec
        except BackendUnavailable as e:
            errors.append(f"{b}: {e}")
            if dec is not None:
                dec.close()
        except Exception as e:  # the backend's own decode error: a damaged file, or a backend limit
            errors.append(f"{b}: {e}")
            if dec is not None:
                dec.close()
            _raise_if_damaged_start(Path(path))  # else a more lenient backend would hide the damage
    raise BackendUnavailable(f"no decoder can read {path} ({codec}): " + "; ".join(errors))


def _raise_if_damaged_start(path: Path) -> None:
    """Raise SourceError when strict PyAV also fails on frame 0: the file is damaged there (bad
    input), not merely unreadable by the backend that failed first."""
    from datakit.errors import SourceError

    try:
        dec = backend_module("pyav").open_video(path, threads=1)
    except BackendUnavailable:
        return
    try:
        dec.get_frames([0])
    except SourceError:
        raise
    except Exception:
        return
    finally:
        dec.close()

"""Decoder registry: every backend behind one signature, chosen by name or "auto".

`open_decoder(path, "auto")` opens the fastest backend known to read the stream's codec for
sequential decoding and falls back to the next one when a backend is missing or cannot read
it. The order comes from `datakit bench-decoders` results when present (see
`recommendations_path()`), else from DEFAULT_ORDER.
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import ModuleType

from datakit.decoders.base import BackendUnavailable, VideoDecoder, VideoInfo, probe_video

BACKENDS = {
    "pyav": "datakit.decoders.pyav_backend",
    "decord": "datakit.decoders.decord_backend",
    "torchcodec": "datakit.decoders.torchcodec_backend",
}
# Used until a bench-decoders run on this machine says otherwise; from bench/results/decoders.md
# (2 and 16 cores, AV1 and H.264, 1 thread): Decord decodes whole files fastest, TorchCodec
# seeks fastest. PyAV, which reads everything, comes last.
DEFAULT_ORDER = {
    "sequential": ["decord", "torchcodec", "pyav"],
    "random": ["torchcodec", "decord", "pyav"],
}

__all__ = [
    "BACKENDS", "BackendUnavailable", "VideoDecoder", "VideoInfo", "probe_video",
    "open_decoder", "backend_order", "backend_module", "recommendations_path",
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


def backend_order(codec: str, pattern: str = "sequential") -> list[str]:
    """Backends to try for a codec and access pattern, fastest first."""
    path = recommendations_path()
    try:
        rec = json.loads(path.read_text())["recommendations"]
        ranked = list(rec[codec][pattern])
    except (OSError, KeyError, ValueError, TypeError):
        ranked = []
    default = DEFAULT_ORDER["sequential" if pattern == "sequential" else "random"]
    return ranked + [b for b in default if b not in ranked]


def open_decoder(path: str | Path, name: str = "auto", *, threads: int = 1, seek_mode: str = "exact",
                 pattern: str = "sequential") -> VideoDecoder:
    """Open `path` with backend `name`; "auto" tries backends in `backend_order` and falls back."""
    if name != "auto":
        return backend_module(name).open_video(path, threads=threads, seek_mode=seek_mode)
    codec = probe_video(path).codec
    errors = []
    for b in backend_order(codec, pattern):
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

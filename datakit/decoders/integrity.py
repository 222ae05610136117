"""A full strict decode of one video, for audits (`datakit doctor`) and tests.

TorchCodec and Decord expose no decoder error reporting (measured: they return concealed
frames for damage PyAV reports), so the only check that sees decode errors is a decode with
PyAV under FFmpeg's `err_detect` plus its per-frame corrupt flag. See docs/convert.md "What
decoding cannot catch" for what no decoder sees."""
from __future__ import annotations

from pathlib import Path

from datakit.errors import SourceError


def strict_decode_error(path: str | Path) -> SourceError | None:
    """Decode every frame of `path` with strict PyAV; the first decode error (naming the file and
    frame) or None when every frame decodes cleanly. Does not raise for damaged input."""
    from datakit.decoders.pyav_backend import PyAVDecoder

    try:
        dec = PyAVDecoder(Path(path), threads=1)
    except SourceError as e:
        return e
    except Exception as e:  # PyAV's own error types for a file it cannot open
        return SourceError(path, f"unreadable video ({type(e).__name__}: {e})")
    try:
        for _ in dec.iter_frames(0, 1 << 62):
            pass
    except SourceError as e:
        return e
    finally:
        dec.close()
    return None

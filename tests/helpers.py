"""Independent oracles for the tests: decode the source straight with PyAV / Pillow."""
from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np


def pyav_decode_all(path: Path) -> np.ndarray:
    """Every frame of an mp4, decoded by PyAV in presentation order, as (N, H, W, 3) uint8."""
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def png_decode(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root (relative name -> bytes), to compare outputs byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

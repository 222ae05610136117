"""Synthetic frames with a machine-readable frame number, and real mp4 encoding (PyAV)."""
from __future__ import annotations

import functools
import os
from fractions import Fraction
from pathlib import Path
from typing import Iterable

import numpy as np

# Frame-number barcode: a band across the top of the frame made of BARCODE_ROWS x BARCODE_COLS
# black/white blocks. 16 data bits (frame number mod 65536) + 8 check bits, so that an all-black
# (padding) or all-white frame, or a frame of some other content, reads as -1.
BARCODE_COLS = 8
BARCODE_ROWS = 3
_CHECK_XOR = 0xA5


def _block_size(height: int, width: int) -> tuple[int, int]:
    return max(8, height // 16), width // BARCODE_COLS  # (block height, block width)


def _check_byte(n: int) -> int:
    return ((n & 0xFF) ^ (n >> 8) ^ _CHECK_XOR) & 0xFF


def _bits(frame_number: int) -> list[int]:
    n = frame_number & 0xFFFF
    word = n | (_check_byte(n) << 16)
    return [(word >> k) & 1 for k in range(BARCODE_ROWS * BARCODE_COLS)]


@functools.lru_cache(maxsize=16)
def _texture(height: int, width: int, seed: int) -> np.ndarray:
    """A (H, 2W, 3) float32 multi-scale noise texture (fine to coarse), like a cluttered scene."""
    rng = np.random.default_rng(seed + 7919)
    tex = np.zeros((height, 2 * width, 3), np.float32)
    for scale, amp in ((2, 14.0), (8, 30.0), (32, 45.0)):
        small = rng.uniform(-1, 1, size=(height // scale + 2, 2 * width // scale + 2, 3)).astype(np.float32)
        big = np.repeat(np.repeat(small, scale, axis=0), scale, axis=1)[:height, : 2 * width]
        k = np.ones(scale, np.float32) / scale  # box blur: smooth the blocks into blobs
        big = np.apply_along_axis(lambda v: np.convolve(v, k, mode="same"), 0, big)
        big = np.apply_along_axis(lambda v: np.convolve(v, k, mode="same"), 1, big)
        tex += amp * big
    return tex


def synth_frame(frame_number: int, height: int, width: int, seed: int = 0, detail: float = 0.0) -> np.ndarray:
    """(H, W, 3) uint8: moving coloured gradients and a moving square, different per seed, with
    `frame_number` written as a barcode band across the top (see `read_frame_number`).
    `detail` (0..1) adds a slowly panning textured background, for realistic bitrates."""
    if width < 8 * BARCODE_COLS or height < 8 * BARCODE_ROWS + 8:
        raise ValueError(f"frame {height}x{width} too small for the barcode (min 32x64)")
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 255, size=3)
    freq = rng.uniform(0.5, 2.0, size=3)
    speed = rng.uniform(0.05, 0.2, size=3)
    t = float(frame_number)
    yy = np.linspace(0.0, 2 * np.pi, height, dtype=np.float32)[:, None, None]
    xx = np.linspace(0.0, 2 * np.pi, width, dtype=np.float32)[None, :, None]
    phase = (speed * t).astype(np.float32)
    img = base.astype(np.float32) + 90.0 * np.sin(freq * xx + phase) * np.cos(freq * yy - 0.5 * phase)
    # a bright square moving across the frame
    side = max(4, min(height, width) // 5)
    cy = int((0.5 + 0.4 * np.sin(0.13 * t + seed)) * (height - side))
    cx = int((0.5 + 0.4 * np.cos(0.11 * t + 2 * seed)) * (width - side))
    if detail > 0:
        shift = (2 * frame_number) % width
        img = img + detail * _texture(height, width, seed)[:, shift : shift + width]
    img[cy:cy + side, cx:cx + side] = 255.0 - base.astype(np.float32)
    out = np.clip(img, 0, 255).astype(np.uint8)
    bh, bw = _block_size(height, width)
    band = out[: BARCODE_ROWS * bh]
    band[...] = 0
    for k, bit in enumerate(_bits(frame_number)):
        r, c = divmod(k, BARCODE_COLS)
        if bit:
            band[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw] = 255
    return out


def read_frame_number(img: np.ndarray) -> int:
    """Decode the barcode written by `synth_frame` (frame number mod 65536); -1 if unreadable."""
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[2] < 1:
        return -1
    height, width = img.shape[:2]
    if width < 8 * BARCODE_COLS or height < 8 * BARCODE_ROWS + 8:
        return -1
    bh, bw = _block_size(height, width)
    luma = img[..., :3].astype(np.float32).mean(axis=2)
    word = 0
    for k in range(BARCODE_ROWS * BARCODE_COLS):
        r, c = divmod(k, BARCODE_COLS)
        y0, x0 = r * bh + bh // 4, c * bw + bw // 4
        v = luma[y0:y0 + max(1, bh // 2), x0:x0 + max(1, bw // 2)].mean()
        if 70 < v < 185:  # neither black nor white: not a barcode
            return -1
        word |= int(v >= 128) << k
    n = word & 0xFFFF
    return n if (word >> 16) == _check_byte(n) else -1


def blank_frame(height: int, width: int) -> np.ndarray:
    return np.zeros((height, width, 3), dtype=np.uint8)


def encode_video(path: str | Path, frames: Iterable[np.ndarray], fps: float, codec: str = "av1",
                 gop: int | None = None, crf: int | None = None) -> Path:
    """Encode RGB uint8 frames (H, W, 3) into an mp4 at `path` (written to a temp name, then
    renamed). codec "av1": LeRobot's settings (libsvtav1, yuv420p, g=2, crf=30); "h264": libx264,
    yuv420p, the encoder's default GOP unless `gop` is given; "hevc": libx265 likewise. Frame i has
    pts i / fps.

    Determinism: the encoders run single-threaded (x264 threads=1, SVT-AV1 lp=1, x265 pools=1
    frame-threads=1) so the same frames give the same bytes on the same machine/library build. x264 also runs with mbtree=0:
    with macroblock-tree rate control its asm paths gave run-to-run different bytes (seen with
    x264 core 165); without it, repeated runs are byte-identical."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    it = iter(frames)
    try:
        first = np.asarray(next(it))
    except StopIteration:
        raise ValueError("encode_video needs at least one frame") from None
    height, width = first.shape[:2]
    rate = Fraction(fps).limit_denominator(1_000_000)
    if codec == "av1":
        name = "libsvtav1"
        options = {"crf": str(30 if crf is None else crf), "g": str(2 if gop is None else gop),
                   "svtav1-params": "lp=1"}
    elif codec == "h264":
        name = "libx264"
        options = {"crf": str(23 if crf is None else crf), "threads": "1", "preset": "veryfast",
                   "x264-params": "mbtree=0"}
        if gop is not None:
            options["g"] = str(gop)
    elif codec == "hevc":
        name = "libx265"
        options = {"crf": str(28 if crf is None else crf), "preset": "veryfast",
                   "x265-params": "pools=1:frame-threads=1:log-level=error"}
        if gop is not None:
            options["g"] = str(gop)
    else:
        raise ValueError(f"unknown codec {codec!r} (av1, h264 or hevc)")
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1: errors only, not its banner per file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream(name, rate=rate, options=options)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.codec_context.time_base = 1 / rate
            if codec == "h264":
                stream.codec_context.thread_count = 1

            def put(i: int, arr: np.ndarray) -> None:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr, dtype=np.uint8), format="rgb24")
                frame.pts = i
                frame.time_base = 1 / rate
                for packet in stream.encode(frame):
                    container.mux(packet)

            put(0, first)
            for i, arr in enumerate(it, start=1):
                put(i, np.asarray(arr))
            for packet in stream.encode():
                container.mux(packet)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path

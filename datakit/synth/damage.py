"""Planted defects for tests and `datakit doctor`: damaged video frame data, bad table values.

Each function writes a copy (or edits a synthetic dataset in place) and says exactly what it
planted, so a test can check that the defect is found where it was put."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class Packet:
    """One compressed video frame as it lies in the file."""

    index: int  # decode order
    pos: int  # byte offset in the file
    size: int
    keyframe: bool


def video_packets(path: str | Path) -> list[Packet]:
    """The video packets of an mp4 (byte position and size of each frame's data), via PyAV."""
    import av

    with av.open(str(path)) as c:
        return [Packet(i, int(p.pos), int(p.size), bool(p.is_keyframe))
                for i, p in enumerate(p for p in c.demux(video=0) if p.size and p.pos is not None)]


def flip_frame_bytes(src: str | Path, dst: str | Path, *, seed: int = 0, keyframe: bool | None = None,
                     count: int = 8, min_size: int = 40) -> Packet:
    """Copy `src` to `dst` with `count` bytes XOR-ed inside one frame's compressed data (never in
    the container header or the first quarter of the packet, where the slice header lies).
    keyframe True/False picks among key/non-key frames, None among all. Returns the packet hit."""
    rng = random.Random(seed)
    packets = [p for p in video_packets(src) if p.size >= min_size and (keyframe is None or p.keyframe == keyframe)]
    if not packets:
        raise ValueError(f"{src}: no packet of {min_size}+ bytes to damage")
    hit = rng.choice(packets)
    data = bytearray(Path(src).read_bytes())
    for _ in range(count):
        i = hit.pos + rng.randrange(hit.size // 4, hit.size)
        data[i] ^= rng.randrange(1, 256)
    Path(dst).write_bytes(bytes(data))
    return hit


def set_table_values(parquet: str | Path, column: str, rows: dict[int, list[float] | float]) -> None:
    """Overwrite whole values of a list column (state/action) or a scalar column in some rows of
    a parquet file, keeping the column's type (e.g. plant NaN, inf or 1e300 in a float64 column)."""
    parquet = Path(parquet)
    table = pq.read_table(parquet)
    values = table[column].to_pylist()
    for r, v in rows.items():
        values[r] = v
    typ = table.schema.field(column).type
    i = table.column_names.index(column)
    table = table.set_column(i, table.schema.field(column), pa.array(values, type=typ))
    pq.write_table(table, parquet)


def widen_float64(parquet: str | Path, column: str) -> None:
    """Store a list<float32> column as list<float64> (real datasets do), so that values outside
    float32 range can be planted."""
    parquet = Path(parquet)
    table = pq.read_table(parquet)
    i = table.column_names.index(column)
    field = pa.field(column, pa.list_(pa.float64()))
    table = table.set_column(i, field, table[column].cast(pa.list_(pa.float64())))
    pq.write_table(table, parquet)


def nonfinite_positions(x: np.ndarray) -> list[tuple[int, int]]:
    """(frame, column) of every NaN/inf or float32-overflowing value of a (T, D) array (an oracle)."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x) | (np.abs(x) > np.finfo(np.float32).max)
    return [(int(t), int(d)) for t, d in np.argwhere(bad)]

"""Per-frame columns of a LeRobot parquet table as numpy arrays; nulls, ragged vector rows and
non-numeric values are a SourceError naming the file, column and row, never a silent reshape."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datakit.errors import SourceError


def vector_column(table: pa.Table, key: str, path: Path) -> np.ndarray:
    """(T, D) float64 values of a vector column (float64 so that values outside float32 range
    can still be named by the checks). Rows of different lengths or null rows/values are a
    SourceError naming the first bad row: flattening them would silently shift values."""
    if key not in table.column_names:
        raise SourceError(path, f"no {key!r} column")
    col = table[key].combine_chunks()
    n = len(col)
    if col.null_count:
        t = col.is_null().to_numpy(zero_copy_only=False).argmax()
        raise SourceError(path, f"column {key!r} is null in row {int(t)}")
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        if not pa.types.is_fixed_size_list(col.type):
            widths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            if n and (widths != widths[0]).any():
                t = int(np.argmax(widths != widths[0]))
                raise SourceError(path, f"column {key!r} has rows of different lengths (row 0 has {widths[0]} "
                                        f"values, row {t} has {widths[t]})")
        flat = col.flatten()
        if flat.null_count:
            raise SourceError(path, f"column {key!r} holds null values")
        try:
            values = flat.to_numpy(zero_copy_only=False).astype(np.float64)
        except (TypeError, ValueError, pa.ArrowException) as e:
            raise SourceError(path, f"column {key!r} is not numeric ({e})") from None
        return values.reshape(n, values.size // n if n else 0)
    try:
        return col.to_numpy(zero_copy_only=False).astype(np.float64).reshape(n, 1)
    except (TypeError, ValueError, pa.ArrowException) as e:
        raise SourceError(path, f"column {key!r} is not numeric ({e})") from None


def image_bytes(table: pa.Table, cam: str, path: Path) -> list[bytes]:
    """Per-frame encoded image bytes of an image column (a struct with `bytes`, or plain binary)."""
    if cam not in table.column_names:
        raise SourceError(path, f"no {cam!r} image column")
    col = table[cam].combine_chunks()
    if pa.types.is_struct(col.type):
        col = col.field("bytes")
    out = col.to_pylist()
    if any(b is None for b in out):
        raise SourceError(path, f"image column {cam!r} has frames without embedded bytes")
    return out


def scalar_column(table: pa.Table, key: str, path: Path, dtype) -> np.ndarray:
    """A numeric per-frame column as `dtype`; nulls, non-numbers and fractional integers are a SourceError."""
    col = table[key]
    if col.null_count:
        raise SourceError(path, f"column {key!r} holds nulls")
    try:
        values = col.to_numpy()
    except (TypeError, ValueError, pa.ArrowException) as e:
        raise SourceError(path, f"column {key!r} is unreadable ({e})") from None
    if values.dtype.kind not in "iuf" + ("" if dtype is np.int64 else "b"):
        raise SourceError(path, f"column {key!r} is not numeric ({values.dtype})")
    out = values.astype(dtype)
    if dtype is np.int64 and values.dtype.kind == "f" and not np.array_equal(out, values):
        raise SourceError(path, f"column {key!r} holds non-integer values")
    return out

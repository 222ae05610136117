"""A safetensors file a checkpoint brings (`model.safetensors`, LeRobot's normalizer state), checked
before safetensors reads it: damage is refused in one line naming the file and what is wrong.

    header = read_header(path)             # {key: Entry(dtype, shape, begin, end)}, or CheckpointError
    header, metadata = read_header_and_metadata(path)   # and its "__metadata__" strings
    tensors = load_checked(path)           # the whole (small) file: the statistics

The format is 8 bytes (little-endian u64, the header's length), the header (a UTF-8 JSON object:
key -> {"dtype", "shape", "data_offsets": [begin, end]} relative to the data section, plus an
optional "__metadata__" of strings), then the data. The checks are the ones safetensors' own reader
makes (0.8: header at most 100 MB, every tensor's bytes = its shape x its dtype's size, the tensors
tile the data section with no gap, overlap or trailing byte), made here first because its errors
name neither the file nor the tensor ("invalid offset for tensor", "header too large") and a
checkpoint copied wrong, cut short or replaced by another file deserves a line that says which:
empty, truncated, a pickle or a zip (torch.save) named `.safetensors`, text. A duplicated key, which
`json.loads` would quietly resolve to its last value, is refused too.
Nothing in a safetensors file can run code; a file that is not one is refused, never handed to
`torch.load`.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainkit.errors import CheckpointError

MAX_HEADER = 100_000_000  # safetensors' own limit on the header's length
# safetensors' dtypes -> bits per element (F4 and F6 pack elements across bytes)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
              "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
# the dtypes weights may have: the loader combines in float32 and casts to the parameter's dtype
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E5M2", "F8_E4M3")


@dataclass(frozen=True)
class Entry:
    """One tensor of the header: its dtype (safetensors' name), shape and byte span in the data."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> dict[str, Entry]:
    """The checked header of the safetensors file `path`; CheckpointError naming the file otherwise."""
    return read_header_and_metadata(path)[0]


def read_header_and_metadata(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """`read_header`, and the file's `__metadata__` strings ({} without any)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(8)
            problem = _first_bytes_problem(head, size)
            raw = b"" if problem else f.read(struct.unpack("<Q", head)[0])
    except OSError as e:
        raise CheckpointError(str(path), f"cannot be read ({e.strerror or e})") from None
    if problem:
        raise CheckpointError(str(path), problem)
    header = _parse(str(path), raw)
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(str(path), "header's __metadata__ is not an object of strings")
    return _entries(str(path), header, size - 8 - len(raw)), meta


def load_checked(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file `path` (a small one: the whole file is read), checked first."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    read_header(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # changed since the check, or a dtype torch lacks
        raise CheckpointError(str(path), f"unreadable safetensors ({type(e).__name__}: {str(e)[:200]})") from None


def _first_bytes_problem(head: bytes, size: int) -> str | None:
    """What is wrong with a file of `size` bytes starting with `head`, judged before its header is
    read (saying what the file looks like instead: a pickle, a zip, text), or None."""
    if size == 0:
        return "is empty (0 bytes), not a safetensors file"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "is a pickle (torch.save's legacy format?), not safetensors: refused unread, nothing in it ran"
    if head[:4] == b"PK\x03\x04":
        return "is a zip archive (torch.save's format?), not safetensors: refused unread, nothing in it ran"
    if size < 8:
        return f"is {size} bytes, too short for a safetensors header"
    n = struct.unpack("<Q", head)[0]
    if n <= size - 8 and n <= MAX_HEADER:
        return None
    if all(32 <= c < 127 or c in b"\t\r\n" for c in head):
        return f"starts with text ({head.decode()!r}), not a safetensors header"
    if n > MAX_HEADER:
        return f"header length {n} is over safetensors' {MAX_HEADER}-byte limit: not a safetensors file"
    return f"header length {n} exceeds the {size - 8} bytes after it: the file is truncated, or not safetensors"


def _parse(path: str, raw: bytes) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise CheckpointError(path, f"header names {k!r} twice (one tensor would hide the other)")
            out[k] = v
        return out

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except UnicodeDecodeError:
        raise CheckpointError(path, "header is not JSON (not UTF-8 text): not a safetensors file") from None
    except ValueError as e:
        raise CheckpointError(path, f"header is not JSON ({e}): not a safetensors file") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, f"header is a JSON {type(header).__name__}, not a JSON object")
    return header


def _entries(path: str, header: dict[str, Any], data_size: int) -> dict[str, Entry]:
    entries = {key: _entry(path, key, value) for key, value in header.items()}
    for key, e in entries.items():
        if e.end > data_size:
            raise CheckpointError(path, f"tensor {key!r} ends at byte {e.end}, past the end of the {data_size}-byte "
                                  "data section: the file is truncated, or its offsets are wrong")
    pos, last = 0, None
    for key, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin < pos:
            raise CheckpointError(path, f"tensors {last!r} and {key!r} overlap (bytes {e.begin}..{pos} of the data)")
        if e.begin > pos:
            raise CheckpointError(path, f"bytes {pos}..{e.begin} of the data belong to no tensor (before {key!r})")
        pos, last = e.end, key
    if pos != data_size:
        raise CheckpointError(path, f"{data_size - pos} bytes after the last tensor: not what a safetensors "
                              "writer makes")
    return entries


def _entry(path: str, key: str, value: Any) -> Entry:
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(path, f"tensor {key!r}: expected {{dtype, shape, data_offsets}}, got {str(value)[:80]}")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise CheckpointError(path, f"tensor {key!r}: dtype {dtype!r} is not a safetensors dtype")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise CheckpointError(path, f"tensor {key!r}: shape {shape} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(x) for x in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(path, f"tensor {key!r}: data_offsets {offsets} is not [begin, end] with begin <= end")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or offsets[1] - offsets[0] != bits // 8:
        raise CheckpointError(path, f"tensor {key!r}: shape {shape} of {dtype} needs {bits / 8:g} bytes; its "
                              f"data_offsets span {offsets[1] - offsets[0]}")
    return Entry(dtype, tuple(shape), offsets[0], offsets[1])


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0

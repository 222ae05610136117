"""Typed reading of source metadata files: json, jsonl, parquet, integer/number fields and
path templates, each failure a one-line SourceError naming the file (never a traceback)."""
from __future__ import annotations

import json
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from datakit.errors import SourceError


def read_json(path: Path):
    """The parsed json of a file; an unreadable or invalid file is a SourceError."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SourceError(path, f"unreadable json: {e}") from None
    except RecursionError:  # valid JSON, but nested deeper than the parser recurses
        raise SourceError(path, "unreadable json: nested too deeply to parse") from None


def _json_line(line: bytes) -> object:
    """One jsonl line parsed; ValueError saying what is wrong with it (position within the line)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:  # its own "line 1 column c" counts within the line: keep the column
        raise ValueError(f"column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def read_jsonl(path: Path) -> list[dict]:
    """The json objects of a jsonl file, one per non-empty line; a missing file, invalid json or a
    line that is not an object is a SourceError naming the line (counting blank lines, as an
    editor does)."""
    if not path.is_file():
        raise SourceError(path, f"missing {path.parent.name}/{path.name}")
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise SourceError(path, f"unreadable jsonl: {e}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = _json_line(line)
        except ValueError as e:  # UnicodeDecodeError included
            raise SourceError(path, f"unreadable jsonl: line {n}: {e}") from None
        if not isinstance(row, dict):
            raise SourceError(path, f"line {n} is not a json object")
        rows.append(row)
    return rows


def int_field(row: dict, key: str, path: Path, what: str) -> int:
    """row[key] as an int; a missing, null, fractional, boolean or non-numeric value is a SourceError."""
    v = row.get(key)
    if isinstance(v, bool) or v is None:
        raise SourceError(path, f"{what}: {'missing' if key not in row else 'invalid'} {key} {v!r}")
    try:
        iv = int(v)
        if iv != v:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise SourceError(path, f"{what}: invalid {key} {v!r} (not an integer)") from None
    return iv


def float_field(row: dict, key: str, path: Path, what: str) -> float:
    """row[key] as a float; a missing, null, boolean or non-numeric value is a SourceError."""
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SourceError(path, f"{what}: invalid {key} {v!r} (not a number)")
    return float(v)


def format_path(tpl: str, path: Path, key: str, **fields) -> str:
    """A data/video path template filled in; an unknown field or bad format is a SourceError."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(tpl) if f is not None]
        unknown = [f for f in names if f not in fields]  # also `{a.b}` / `{a[0]}` lookups
        if unknown:
            raise KeyError(unknown[0])
        out = tpl.format(**fields)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
        raise SourceError(path, f"{key} template {tpl!r} is invalid ({type(e).__name__}: {e}); "
                                f"fields available: {', '.join(sorted(fields))}") from None
    if Path(out).is_absolute() or ".." in Path(out).parts:
        raise SourceError(path, f"{key} template {tpl!r} gives {out!r}, outside the dataset folder")
    return out


def read_parquet(path: Path, columns=None, filters=None) -> pa.Table:
    """A parquet table (optionally some columns / filtered rows); missing or unreadable: SourceError."""
    if not path.is_file():
        raise SourceError(path, "missing parquet file")
    try:
        return pq.read_table(path, columns=columns, filters=filters)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise SourceError(path, f"unreadable parquet: {e}") from None

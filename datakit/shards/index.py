"""The global shard index: the single source of truth for readers.

Two files, written only after every shard is closed (frames table first, manifest last,
each to a temporary name and renamed):
- `index.json`: the manifest (format version, schema, fps, layout, cameras and their
  status, tasks, normalisation statistics, per-shard name/bytes/sha256/episode and row
  ranges, per-episode rows and camera status, skipped episodes, conversion options).
- `frames.arrow`: an uncompressed Arrow IPC file of ONE record batch (so every column is one
  buffer, viewed without a copy at any row count), one row per frame in (episode, frame)
  order, memory-mappable: episode_index, frame_index, timestamp, task_index, state, action
  (fixed-size lists of float32), shard (int32), and for each camera `offset/<camera>`: the
  byte offset in that shard of the camera's raw pixel data (after the .npy header), -1 when
  the camera has no video in that episode. Every frame of a camera has `frame_bytes` bytes
  with shape `frame_shape` (rgb: (H, W, 3); nv12: (H*3//2, W)).
- `checksums.json`, written last: the sha256 of both (its presence = the conversion finished).

Both are input to every reader: `load_index` checks the manifest field by field
(`manifest_check`) and `load_frames` the table's schema and row count; then both compare the
bytes they hold with checksums.json (`checksums`), so a reader never uses an index file the
conversion did not write, nor an OUT without checksums.json. A bad file raises IndexFileError
naming it. index.json is strict JSON both ways (no NaN/Infinity).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from datakit.durable import atomic_path, file_sha256, write_atomic  # noqa: F401  (write_atomic re-exported)
from datakit.errors import IndexFileError, Problem
from datakit.shards import checksums
from datakit.shards.manifest_check import CAMERA_STATUSES, check_manifest
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME

FORMAT_NAME = "datakit-shards"
FORMAT_VERSION = 2  # 2: checksums.json, camera `status` (was `slot`), source fingerprint
FRAME_KEY = "{episode:06d}/{frame:06d}"  # tar member key; members are <key>.<field>
OFFSET_PREFIX = "offset/"
STATUS_REAL, STATUS_BLANK, STATUS_MISSING = CAMERA_STATUSES  # a camera in an episode


@dataclass
class CameraEntry:
    height: int
    width: int
    status: str  # "real" if any episode has this camera real, else "blank", else "missing"
    frame_shape: list[int]  # shape of one stored frame (rgb HxWx3, nv12 (H*3/2)xW)
    frame_bytes: int
    source_height: int
    source_width: int
    episodes: dict[str, int] = field(default_factory=dict)  # status -> number of episodes


@dataclass
class ShardEntry:
    name: str
    bytes: int
    sha256: str
    episodes: list[int]  # [first, last] episode_index held (inclusive)
    rows: list[int]  # [start, stop) rows of the frames table
    num_frames: int


@dataclass
class EpisodeEntry:
    episode_index: int
    length: int
    shard: int
    row_start: int
    task: str
    camera_status: dict[str, str]  # camera -> real | blank | missing


@dataclass
class ShardIndex:
    """The manifest; `frames` (the per-frame table) is loaded separately by `load_frames`."""

    fps: float
    layout: str  # "rgb" | "nv12"
    cameras: dict[str, CameraEntry]
    state_names: list[str]
    action_names: list[str]
    tasks: list[str]
    stats: dict[str, dict[str, list[float]]]  # "state"/"action" -> mean, std, min, max, q01, q99
    shards: list[ShardEntry]
    episodes: list[EpisodeEntry]
    skipped: list[dict[str, Any]]  # {"episode_index", "source", "reason"}
    source: dict[str, Any]  # {"format", "version", "name"}
    options: dict[str, Any]
    schema: dict[str, Any] = field(default_factory=dict)  # tar key pattern + every member's dtype/shape
    num_episodes: int = 0
    num_frames: int = 0
    num_shards: int = 0
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        """Strict JSON (no NaN/Infinity, which strict parsers reject): a non-finite value raises
        IndexFileError naming the field instead of being written."""
        d = asdict(self)
        try:
            return json.dumps(d, indent=1, allow_nan=False) + "\n"  # insertion order: cameras as declared
        except ValueError:
            field_, value = _first_non_finite(d)
            raise IndexFileError(MANIFEST_NAME, f"{field_} is {value}, which strict JSON cannot hold") from None

    @classmethod
    def from_json(cls, text: str | bytes, path: str | Path = MANIFEST_NAME,
                  problems: list[Problem] | None = None) -> "ShardIndex":
        """Parse and check a manifest (`manifest_check`); any problem raises IndexFileError
        naming `path` and the field, before a reader trusts a name or a number in it. With
        `problems` (for `verify`), values that only disagree with each other are listed there."""
        try:
            d = json.loads(text, parse_constant=_reject_constant)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise IndexFileError(path, f"not valid JSON ({e})") from None
        except _NotStrict as e:
            raise IndexFileError(path, f"holds {e}, which is not strict JSON") from None
        except RecursionError:
            raise IndexFileError(path, "not valid JSON (nested too deeply to parse)") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise IndexFileError(path, f"not a {FORMAT_NAME} index (format={got!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise IndexFileError(path, f"unsupported index format_version {d.get('format_version')!r}")
        schema = {"index": _fields(cls), "camera": _fields(CameraEntry), "shard": _fields(ShardEntry),
                  "episode": _fields(EpisodeEntry)}
        check_manifest(d, Path(path), schema, problems)
        d["cameras"] = {k: CameraEntry(**v) for k, v in d["cameras"].items()}
        d["shards"] = [ShardEntry(**s) for s in d["shards"]]
        d["episodes"] = [EpisodeEntry(**e) for e in d["episodes"]]
        return cls(**d)

    def info(self) -> dict[str, Any]:
        """The `datakit info --json` view."""
        return {
            "num_episodes": self.num_episodes,
            "num_frames": self.num_frames,
            "num_shards": self.num_shards,
            "bytes": sum(s.bytes for s in self.shards),
            "fps": self.fps,
            "layout": self.layout,
            "cameras": {
                n: {"height": c.height, "width": c.width, "status": c.status, "episodes": c.episodes}
                for n, c in self.cameras.items()
            },
            "state_dim": len(self.state_names),
            "action_dim": len(self.action_names),
            "tasks": len(self.tasks),
            "skipped": self.skipped,
            "source": {k: v for k, v in self.source.items() if k != "fingerprint"},  # the fingerprint is per episode: large
        }


def _fields(cls: type) -> tuple[set[str], set[str]]:
    """(required, optional) field names of a dataclass: what its JSON object must / may hold."""
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    return required, names - required


class _NotStrict(ValueError):
    """json.loads met NaN, Infinity or -Infinity."""


def _reject_constant(token: str) -> float:
    raise _NotStrict(token)


def _first_non_finite(v: Any, where: str = "index") -> tuple[str, float] | None:
    """(field, value) of the first NaN/inf in a nested dict/list, or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return where, v
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        found = _first_non_finite(x, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]")
        if found:
            return found
    return None


def member_schema(cameras: dict[str, CameraEntry], state_dim: int, action_dim: int) -> dict[str, Any]:
    """What each tar member of a frame holds, declared up front (readers need not open a .npy)."""
    members: dict[str, Any] = {f"{c}.npy": {"dtype": "uint8", "shape": e.frame_shape} for c, e in cameras.items()}
    members["state.npy"] = {"dtype": "float32", "shape": [state_dim]}
    members["action.npy"] = {"dtype": "float32", "shape": [action_dim]}
    members["json"] = {"keys": ["episode_index", "frame_index", "timestamp", "task_index", "task"]}
    return {"key": FRAME_KEY, "members": members, "frames_table": FRAMES_NAME}


def frames_schema(cameras: list[str], state_dim: int, action_dim: int) -> pa.Schema:
    fields = [
        pa.field("episode_index", pa.int64()),
        pa.field("frame_index", pa.int64()),
        pa.field("timestamp", pa.float64()),
        pa.field("task_index", pa.int64()),
        pa.field("state", pa.list_(pa.float32(), state_dim)),
        pa.field("action", pa.list_(pa.float32(), action_dim)),
        pa.field("shard", pa.int32()),
    ]
    fields += [pa.field(OFFSET_PREFIX + c, pa.int64()) for c in cameras]
    return pa.schema(fields)


def write_frames(path: Path, table: pa.Table) -> None:
    """Write the per-frame table as ONE record batch, so every column is one contiguous buffer
    that `column()` can view without a copy at any row count (an IPC file of several batches
    puts metadata between them, and reading a column would mean concatenating, i.e. copying)."""
    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as w:
            w.write_table(table.combine_chunks())  # no max_chunksize: one batch per (single) chunk


def write_index(out: Path, index: ShardIndex, table: pa.Table) -> None:
    """Write the index files after every shard is committed: frames table, manifest, then the
    checksums of both (its presence means the conversion finished; `verify` checks them)."""
    out = Path(out)
    manifest = index.to_json().encode()  # first: a value strict JSON cannot hold fails before any write
    write_frames(out / FRAMES_NAME, table)
    write_atomic(out / MANIFEST_NAME, manifest)
    write_checksums(out)


def write_checksums(out: Path) -> None:
    """checksums.json, the last file of a finished folder (shards or features): the sha256 of its
    index.json and frames.arrow."""
    sums = {name: file_sha256(Path(out) / name) for name in (MANIFEST_NAME, FRAMES_NAME)}
    write_atomic(Path(out) / CHECKSUMS_NAME, (json.dumps({"sha256": sums}, indent=1) + "\n").encode())


def is_finished(out: Path) -> bool:
    """A conversion into `out` finished: its last file, the checksums, is there."""
    return (Path(out) / CHECKSUMS_NAME).exists()


def load_index(out: Path, problems: list[Problem] | None = None) -> ShardIndex:
    """The checked manifest of `out`, as every reader loads it: IndexFileError naming index.json
    when it is missing or bad, or when its bytes are not the ones checksums.json records
    (naming checksums.json when that is missing: the conversion did not finish).

    With `problems` (`datakit verify`), inconsistent values are listed there instead (see
    `ShardIndex.from_json`) and checksums.json is left to the caller, which lists a mismatch."""
    path = Path(out) / MANIFEST_NAME
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise IndexFileError(path, "missing: not a converted output folder, or its conversion has not finished") from None
    except OSError as e:
        raise IndexFileError(path, f"unreadable ({e.strerror or e})") from None
    index = ShardIndex.from_json(text, path, problems)
    if problems is None:  # the field checks first: they say more than a checksum does
        checksums.check(out, MANIFEST_NAME, checksums.digest(text))
    return index


def load_frames(out: Path, index: ShardIndex | None = None) -> pa.Table:
    """Memory-map the per-frame table (no copy; `column()` gives zero-copy numpy views).

    With `index` (every reader), the table's schema and row count are checked against the
    manifest and the mapped bytes against checksums.json (hashed once per process while the
    file is unchanged). A missing, truncated, garbage or changed file raises IndexFileError
    naming frames.arrow. Without `index` (`verify`, tests), only readability is checked."""
    path = Path(out) / FRAMES_NAME
    try:
        mapped = pa.memory_map(str(path), "r")
        data, st = mapped.read_buffer(mapped.size()), os.fstat(mapped.fileno())  # exactly what the table views
        mapped.seek(0)
        table = ipc.open_file(mapped).read_all()
        table.validate()  # buffer sizes against lengths (metadata only, no scan of the data)
    except FileNotFoundError:
        raise IndexFileError(path, "missing: the conversion has not finished") from None
    except (pa.ArrowException, OSError, ValueError) as e:
        raise IndexFileError(path, f"not a readable Arrow IPC file, truncated or damaged ({e})") from None
    if index is not None:
        check_frames_schema(table, index, path)
        checksums.check(out, FRAMES_NAME, checksums.digest(memoryview(data), st))
    return table


def conversion_id(out: Path) -> dict[str, str]:
    """The identity of the conversion in `out`: the digests its checksums.json records (content,
    so an unchanged rerun keeps it). IndexFileError naming checksums.json when it is missing."""
    return checksums.recorded(out, (MANIFEST_NAME, FRAMES_NAME))


def check_frames_schema(table: pa.Table, index: ShardIndex, path: Path) -> None:
    """The table has the manifest's columns, types, row count and no nulls."""
    want = frames_schema(list(index.cameras), len(index.state_names), len(index.action_names))
    if not table.schema.equals(want):
        have = {f.name: str(f.type) for f in table.schema}
        diff = [f"{f.name} ({f.type})" for f in want if have.get(f.name) != str(f.type)]
        extra = [n for n in have if n not in want.names]
        raise IndexFileError(path, f"columns differ from the index: expected {', '.join(diff) or '-'}"
                                   f"{'; unexpected ' + ', '.join(extra) if extra else ''}")
    if table.num_rows != index.num_frames:
        raise IndexFileError(path, f"{table.num_rows} rows, index.json says {index.num_frames} frames")
    nulls = [n for n in table.column_names if table.column(n).null_count]
    if nulls:
        raise IndexFileError(path, f"null values in column {nulls[0]!r}")


def column(table: pa.Table, name: str) -> np.ndarray:
    """A zero-copy, read-only numpy view of a column; fixed-size lists come back as (rows, dim).

    `write_frames` writes one record batch, so a column is one chunk at any row count. A file
    of several batches (datakit before this check wrote one per 1M rows) would need a copy of
    the column in every process that reads it, GBs at DROID scale: it raises IndexFileError."""
    col = table.column(name)
    if col.num_chunks > 1:
        raise IndexFileError(FRAMES_NAME, f"column {name!r} is split into {col.num_chunks} record batches; "
                                          "reading it would copy it: convert again to rewrite it as one batch")
    arr = col.chunk(0) if col.num_chunks else pa.array([], type=col.type)
    if pa.types.is_fixed_size_list(arr.type):
        return arr.flatten().to_numpy(zero_copy_only=True).reshape(-1, arr.type.list_size)
    return arr.to_numpy(zero_copy_only=True)

"""The global shard index: the single source of truth for readers.

Two files, written only after every shard is closed (frames table first, manifest last,
each to a temporary name and renamed):
- `index.json`: the manifest (format version, schema, fps, layout, cameras and their slot
  status, tasks, normalisation statistics, per-shard name/bytes/sha256/episode and row
  ranges, per-episode rows and slots, skipped episodes, conversion options).
- `frames.arrow`: an uncompressed Arrow IPC file, one row per frame in (episode, frame)
  order, memory-mappable: episode_index, frame_index, timestamp, task_index, state, action
  (fixed-size lists of float32), shard (int32), and for each camera `offset/<camera>`: the
  byte offset in that shard of the camera's raw pixel data (after the .npy header), -1 when
  the camera has no video in that episode. Every frame of a camera has `frame_bytes` bytes
  with shape `frame_shape` (rgb: (H, W, 3); nv12: (H*3//2, W)).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from datakit.durable import file_sha256, fsync_dir, write_atomic  # noqa: F401  (write_atomic re-exported)

FORMAT_NAME = "datakit-shards"
FORMAT_VERSION = 1
MANIFEST_NAME = "index.json"
FRAMES_NAME = "frames.arrow"
CHECKSUMS_NAME = "checksums.json"  # sha256 of index.json and frames.arrow; written last = finished
SHARD_PATTERN = "shard-{index:06d}.tar"
FRAME_KEY = "{episode:06d}/{frame:06d}"  # tar member key; members are <key>.<field>
OFFSET_PREFIX = "offset/"
SLOT_REAL, SLOT_BLANK, SLOT_MISSING = "real", "blank", "missing"


@dataclass
class CameraEntry:
    height: int
    width: int
    slot: str  # "real" if any episode has this camera real, else "blank", else "missing"
    frame_shape: list[int]  # shape of one stored frame (rgb HxWx3, nv12 (H*3/2)xW)
    frame_bytes: int
    source_height: int
    source_width: int
    episodes: dict[str, int] = field(default_factory=dict)  # slot -> number of episodes


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
    slots: dict[str, str]  # camera -> real | blank | missing


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
        return json.dumps(asdict(self), indent=1) + "\n"  # insertion order: cameras as declared

    @classmethod
    def from_json(cls, text: str) -> "ShardIndex":
        d = json.loads(text)
        if d.get("format") != FORMAT_NAME:
            raise ValueError(f"not a {FORMAT_NAME} index (format={d.get('format')!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported index format_version {d.get('format_version')}")
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
                n: {"height": c.height, "width": c.width, "slot": c.slot, "episodes": c.episodes}
                for n, c in self.cameras.items()
            },
            "state_dim": len(self.state_names),
            "action_dim": len(self.action_names),
            "tasks": len(self.tasks),
            "skipped": self.skipped,
            "source": self.source,
        }


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
    tmp = path.with_name(path.name + ".tmp")
    with pa.OSFile(str(tmp), "wb") as sink:
        with ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=1 << 20)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_index(out: Path, index: ShardIndex, table: pa.Table) -> None:
    """Write the index files after every shard is committed: frames table, manifest, then the
    checksums of both (its presence means the conversion finished; `verify` checks them)."""
    out = Path(out)
    write_frames(out / FRAMES_NAME, table)
    write_atomic(out / MANIFEST_NAME, index.to_json().encode())
    sums = {name: file_sha256(out / name) for name in (MANIFEST_NAME, FRAMES_NAME)}
    write_atomic(out / CHECKSUMS_NAME, (json.dumps({"sha256": sums}, indent=1) + "\n").encode())


def is_finished(out: Path) -> bool:
    """A conversion into `out` finished: its last file, the checksums, is there."""
    return (Path(out) / CHECKSUMS_NAME).exists()


def load_index(out: Path) -> ShardIndex:
    return ShardIndex.from_json((Path(out) / MANIFEST_NAME).read_text())


def load_frames(out: Path) -> pa.Table:
    """Memory-map the per-frame table (no copy; columns are zero-copy numpy-convertible)."""
    source = pa.memory_map(str(Path(out) / FRAMES_NAME), "r")
    return ipc.open_file(source).read_all()


def column(table: pa.Table, name: str) -> np.ndarray:
    """A numpy view of a column; fixed-size lists come back as (rows, dim)."""
    col = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        dim = col.type.list_size
        return col.values.to_numpy(zero_copy_only=False).reshape(-1, dim)
    return col.to_numpy(zero_copy_only=False)

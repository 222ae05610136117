"""Random access to converted shards: any frame by (episode, frame, camera), no scan, no decode.

`open_shards(OUT)` memory-maps the per-frame table and, lazily, each shard; a frame is a
slice at the byte offset the index holds. Needs only numpy, pyarrow and torch.

The index is checked on open (`shards/manifest_check.py`, `shards/frames_check.py`): a
malformed index.json or frames.arrow raises IndexFileError naming the file, a shard name that
would leave the folder is refused. Shards are checked when first opened (`verify`):
"size" (default, free) cannot see bytes changed in place without changing the size; "sha256"
hashes each shard once per process before its first read. At most `max_open` shards are
open at a time (`shards/open_files.py`).

A remote root (`open_shards("s3://bucket/out", cache_dir=..., cache_bytes=...)`) is read
through the node-local download cache (`storage/roots.py`): index files once, each shard
downloaded whole when first needed, then memory-mapped from the cache like a local one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from datakit.shards.frames_check import check_reads
from datakit.shards.index import OFFSET_PREFIX, ShardIndex, column, load_frames, load_index
from datakit.shards.open_files import DEFAULT_MAX_OPEN, OpenShards
from datakit.stages.colour import black_frame, nv12_to_rgb
from datakit.storage.roots import open_root


class ShardReader:
    """Read-only view of a converted output folder."""

    def __init__(self, out: str | Path, *, verify: str = "size", max_open: int = DEFAULT_MAX_OPEN,
                 cache_dir: str | Path | None = None, cache_bytes: int = 0,
                 storage_options: dict[str, Any] | None = None):
        folder, self.cache = open_root(out, verify=verify, cache_dir=cache_dir, cache_bytes=cache_bytes,
                                       storage_options=storage_options)
        # what errors name: the local folder, or the URL of a remote root
        self.root: str | Path = self.cache.root_url if self.cache is not None else folder
        self.index: ShardIndex = load_index(folder)
        self.frames: pa.Table = load_frames(folder, self.index)
        self.cameras = list(self.index.cameras)
        self.episode_index = column(self.frames, "episode_index")
        self.frame_index = column(self.frames, "frame_index")
        self.shard = column(self.frames, "shard")
        self.offsets = {c: column(self.frames, OFFSET_PREFIX + c) for c in self.cameras}
        check_reads(self.index, self.shard, self.offsets, folder)
        self._row_start = {e.episode_index: (e.row_start, e.length) for e in self.index.episodes}
        self.files = OpenShards(folder, self.index.shards, verify=verify, max_open=max_open, cache=self.cache)

    def __len__(self) -> int:
        return self.index.num_frames

    def row(self, episode_index: int, frame_index: int) -> int:
        """Row of the frames table for (episode, frame); KeyError/IndexError when absent."""
        if episode_index not in self._row_start:
            raise KeyError(f"episode {episode_index} is not in {self.root} (skipped or absent)")
        start, length = self._row_start[episode_index]
        if not 0 <= frame_index < length:
            raise IndexError(f"frame {frame_index} outside episode {episode_index} (length {length})")
        return start + frame_index

    def shard_map(self, shard: int) -> np.ndarray:
        """The shard as a read-only byte array (a memory map, checked on open, kept in an LRU)."""
        return self.files.bytes(shard)

    def read_raw(self, row: int, camera: str) -> np.ndarray:
        """The stored frame (rgb (H,W,3) or nv12 (H*3/2,W)) as a read-only view; black if missing
        (the bytes the loader gives a missing frame: `black_frame`)."""
        cam = self.index.cameras[camera]
        off = int(self.offsets[camera][row])
        if off < 0:
            return black_frame(cam.frame_shape, self.index.layout)
        data = self.shard_map(int(self.shard[row]))[off : off + cam.frame_bytes]
        return data.reshape(cam.frame_shape)

    def read_frame(self, episode_index: int, frame_index: int, camera: str) -> np.ndarray:
        """(H, W, 3) uint8 RGB of one frame, whatever the stored layout."""
        if camera not in self.index.cameras:
            raise KeyError(f"unknown camera {camera!r} (have: {', '.join(self.cameras)})")
        raw = self.read_raw(self.row(episode_index, frame_index), camera)
        if self.index.layout == "nv12":
            return nv12_to_rgb(torch.from_numpy(np.array(raw))[None])[0].numpy()
        return np.array(raw)

    def close(self) -> None:
        """Close the open shard files now rather than at garbage collection."""
        self.files.close()
        if self.cache is not None:
            self.cache.close()


def open_shards(out: str | Path, *, verify: str = "size", max_open: int = DEFAULT_MAX_OPEN,
                cache_dir: str | Path | None = None, cache_bytes: int = 0,
                storage_options: dict[str, Any] | None = None) -> ShardReader:
    """Open a converted output folder (or a remote root: `s3://...`, through a download cache in
    `cache_dir` of at most `cache_bytes`) for random access; `verify="sha256"` hashes each shard
    once per process before its first read (see ShardReader)."""
    return ShardReader(out, verify=verify, max_open=max_open, cache_dir=cache_dir, cache_bytes=cache_bytes,
                       storage_options=storage_options)

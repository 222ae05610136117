"""Tar writing: frames -> tar members (frame-major) appended to a shard written under a
temporary name, hashed on the fly, fsynced and renamed when closed.

Tar headers are position-independent (fixed mtime/uid/mode, USTAR), so the same frames give the
same bytes wherever they land; offsets are recorded relative to where an episode starts.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import tarfile
import threading
from pathlib import Path
from typing import BinaryIO

import numpy as np

from datakit.durable import file_sha256
from datakit.shards.index import FRAME_KEY

BLOCK = tarfile.BLOCKSIZE  # 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy v1.0 header numpy writes for a C-contiguous array (its length is a multiple of 64)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    )
    return buf.getvalue()


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")


class FrameWriter:
    """Writes the members of consecutive frames into a binary stream, tracking pixel offsets
    relative to where it started."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.pos = 0
        self._headers: dict[tuple[tuple[int, ...], str], bytes] = {}

    def _member(self, name: str, payload: list[bytes | memoryview]) -> int:
        """Write one member; returns the offset of its data (after the tar header)."""
        size = sum(len(p) for p in payload)
        hdr = tar_header(name, size)
        self.f.write(hdr)
        data_at = self.pos + len(hdr)
        for p in payload:
            self.f.write(p)
        pad = -size % BLOCK
        if pad:
            self.f.write(b"\0" * pad)
        self.pos = data_at + size + pad
        return data_at

    def _npy(self, name: str, arr: np.ndarray) -> int:
        key = (arr.shape, arr.dtype.str)
        hdr = self._headers.get(key)
        if hdr is None:
            hdr = self._headers[key] = npy_header(arr.shape, arr.dtype)
        return self._member(name, [hdr, memoryview(np.ascontiguousarray(arr)).cast("B")]) + len(hdr)

    def write_frame(self, episode: int, frame: int, images: dict[str, np.ndarray], state: np.ndarray,
                    action: np.ndarray, meta: dict) -> dict[str, int]:
        """All fields of one frame under one key; returns camera -> offset of its pixel data."""
        key = FRAME_KEY.format(episode=episode, frame=frame)
        offsets = {cam: self._npy(f"{key}.{cam}.npy", img) for cam, img in images.items()}
        self._npy(f"{key}.state.npy", state)
        self._npy(f"{key}.action.npy", action)
        self._member(f"{key}.json", [json.dumps(meta, sort_keys=True).encode()])
        return offsets


class ShardFile:
    """A shard being assembled under a temporary name; `close()` ends the archive, fsyncs and renames.

    SHA-256 runs on a helper thread (hashlib releases the GIL), off the decoding thread.
    """

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.f = open(self.tmp, "wb")
        self.bytes = 0
        self._sha = hashlib.sha256()
        self._rehash = False  # set when bytes were rolled back: hash the file again at close
        self._q: queue.Queue = queue.Queue(maxsize=256)
        self._hasher = threading.Thread(target=self._hash_loop, name=f"sha256-{path.name}", daemon=True)
        self._hasher.start()

    def _hash_loop(self) -> None:
        while (item := self._q.get()) is not None:
            self._sha.update(item)

    def write(self, data: bytes | memoryview) -> int:
        """Append bytes; `data` must not change afterwards (it is hashed later, on the helper thread)."""
        self.f.write(data)
        self._q.put(data)
        self.bytes += len(data)
        return len(data)

    def truncate(self, size: int) -> None:
        """Roll back to `size` bytes (an episode that failed half-way through)."""
        self.f.flush()
        self.f.truncate(size)
        self.f.seek(size)
        self.bytes = size
        self._rehash = True

    def finish(self) -> tuple[int, str]:
        """End the archive and return (bytes, sha256); the data may not be on disk yet."""
        self.write(END_OF_ARCHIVE)
        self._q.put(None)
        self._hasher.join()
        self.f.flush()
        self._digest = file_sha256(self.tmp) if self._rehash else self._sha.hexdigest()
        return self.bytes, self._digest

    def commit(self) -> None:
        """fsync and rename: from here on the shard is complete under its final name."""
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)

    def close(self) -> tuple[int, str]:
        nbytes, digest = self.finish()
        self.commit()
        return nbytes, digest

    def abort(self) -> None:
        self._q.put(None)
        self._hasher.join()
        self.f.close()
        self.tmp.unlink(missing_ok=True)


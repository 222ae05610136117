"""Every check of `datakit verify` on one folder of index files and shards: the folder is what
the conversion wrote, or each problem is named (a `Problem(where, what)`).

In order:
1. checksums.json (written last) holds the sha256 of index.json and frames.arrow: an edited
   state value, offset or manifest field fails here first;
2. index.json is checked field by field (`shards/manifest_check.py`): types, shard and camera
   names, frame_shape against the layout and size, frame_bytes = prod(frame_shape), shard row
   and episode ranges tiling the table, episode rows inside their shard, totals; and it must
   hold at least one episode;
3. frames.arrow row by row against the manifest (`shards/frames_check.py`): each row's episode,
   frame, shard and task, and every offset either -1 or inside its shard;
4. each shard: size (`durable.check_size`), sha256, every indexed offset against the tar
   headers (each camera member must start exactly there, with the .npy header of frame_shape),
   and every state / action member against the frames table, bit for bit.
Steps 2-4 run whatever step 1 found, so damage is named even when checksums.json was rewritten
to match it; checksum problems are listed after the specific ones. A manifest that cannot be parsed at all (not JSON, wrong types, missing fields) or
a frames table that cannot be read raises IndexFileError (the CLI prints it and exits 2).

A remote root (`verify("s3://bucket/out")`) gets the same checks through `check_folder`, one
shard on local disk at a time (`verify/remote.py`).

What it cannot prove: that the source was converted correctly (the tests do that against
independent decoders), or anything about a folder whose checksums.json, index.json,
frames.arrow and shards were all rewritten consistently.
"""
from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager

import numpy as np

from datakit.durable import check_size, file_sha256
from datakit.errors import IndexFileError, Problem, ShardError
from datakit.shards.frames_check import table_problems
from datakit.shards.index import (
    FRAME_KEY, OFFSET_PREFIX, ShardEntry, check_frames_schema, column, load_frames, load_index,
)
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME
from datakit.shards.writer import npy_header


@dataclass
class VerifyReport:
    shards: int = 0
    bytes: int = 0
    frames: int = 0
    offsets_checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def checksum_problems(out: Path) -> list[Problem]:
    """index.json and frames.arrow against the sha256 that checksums.json records."""
    path = out / CHECKSUMS_NAME
    try:
        sums = json.loads(path.read_text())["sha256"]
        want = {name: sums[name] for name in (MANIFEST_NAME, FRAMES_NAME)}
    except FileNotFoundError:
        return [Problem(str(path), "missing: the conversion did not finish (or the file was removed)")]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [Problem(str(path), f"unreadable ({type(e).__name__}: {e})")]
    except RecursionError:
        return [Problem(str(path), "unreadable (JSON nested too deeply to parse)")]
    problems = []
    for name, digest in want.items():
        if not (out / name).exists():
            continue  # named by the load that follows
        if file_sha256(out / name) != digest:
            problems.append(Problem(str(out / name), f"sha256 differs from {CHECKSUMS_NAME} (the file was modified)"))
    return problems


def _tar_members(path: Path) -> dict[str, int]:
    """member name -> offset of its data, from a walk of the tar headers (stock tarfile)."""
    with tarfile.open(path, "r:") as tf:
        return {m.name: m.offset_data for m in tf}


def _camera_problems(path: Path, data: np.ndarray, found: dict[str, int], expected: dict[str, int],
                     headers: dict[str, bytes]) -> list[Problem]:
    """Every indexed camera member sits exactly at its indexed offset, and its .npy header
    declares the index's frame_shape (a transposed shape fails here)."""
    problems = []
    for name, off in expected.items():
        hdr = headers[name]
        if name not in found:
            problems.append(Problem(str(path), f"member {name} is missing"))
        elif found[name] + len(hdr) != off:
            problems.append(Problem(str(path), f"member {name} is at {found[name]}, the index says {off - len(hdr)}"))
        elif data[found[name] : found[name] + len(hdr)].tobytes() != hdr:
            problems.append(Problem(str(path), f"member {name} is not a uint8 array of the index's frame_shape"))
        if len(problems) > 5:
            break
    return problems


def _vector_problems(path: Path, data: np.ndarray, found: dict[str, int], keys: list[str], field: str,
                     want: np.ndarray, rows: np.ndarray) -> list[Problem]:
    """The `<key>.<field>.npy` members (state, action) hold, bit for bit, the frames table's
    values: an edited value in frames.arrow is caught even with checksums.json rewritten."""
    dim = want.shape[1]
    hdr = np.frombuffer(npy_header((dim,), np.dtype(np.float32)), np.uint8)
    names = [f"{k}.{field}.npy" for k in keys]
    missing = [n for n in names if n not in found]
    if missing:
        return [Problem(str(path), f"member {missing[0]} is missing ({len(missing)} {field} members)")]
    pos = np.array([found[n] for n in names], np.int64)
    if not pos.size:
        return []
    if int(pos.max()) + hdr.size + 4 * dim > data.size:
        return [Problem(str(path), f"a {field} member runs past the end of the shard")]
    bad = np.flatnonzero((data[pos[:, None] + np.arange(hdr.size)] != hdr).any(axis=1))
    if bad.size:
        return [Problem(str(path), f"member {names[bad[0]]} is not a float32 array of {dim} values")]
    got = data[pos[:, None] + hdr.size + np.arange(4 * dim)].view("<u4")  # (n, dim) bits
    diff = np.flatnonzero((got != np.ascontiguousarray(want, "<f4").view("<u4")).any(axis=1))
    if diff.size:
        i = int(diff[0])
        return [Problem(str(path), f"member {names[i]} differs from {FRAMES_NAME} column {field!r} row "
                        f"{int(rows[i])} ({diff.size} frames)")]
    return []


def _shard_problems(path: Path, size: int, rows: np.ndarray, index, cols: dict[str, np.ndarray],
                    offsets: dict[str, np.ndarray]) -> tuple[list[Problem], int]:
    """Every member the frames table implies, against the tar: (problems, camera offsets checked)."""
    try:
        found = _tar_members(path)
    except (tarfile.TarError, OSError) as e:
        return [Problem(str(path), f"unreadable tar ({e})")], 0
    keys = [FRAME_KEY.format(episode=int(e), frame=int(f)) for e, f in zip(cols["episode_index"][rows],
                                                                         cols["frame_index"][rows])]
    expected: dict[str, int] = {}
    hdrs: dict[str, bytes] = {}
    for cam, c in index.cameras.items():
        offs = offsets[cam][rows]
        h = npy_header(tuple(c.frame_shape), np.dtype(np.uint8))
        for key, o in zip(keys, offs.tolist()):
            if o < 0 or o + c.frame_bytes > size:
                continue  # named by the frames table check
            expected[f"{key}.{cam}.npy"] = o
            hdrs[f"{key}.{cam}.npy"] = h
    data = np.memmap(path, dtype=np.uint8, mode="r")
    problems = _camera_problems(path, data, found, expected, hdrs)
    for field in ("state", "action"):
        problems += _vector_problems(path, data, found, keys, field, cols[field][rows], rows)
    return problems, len(expected)


ShardFile = Callable[[ShardEntry], ContextManager[tuple[Path, "int | None"]]]


def shard_intact(path: Path, size: int, entry, rep: "VerifyReport") -> bool:
    """Whether a shard file has the index's size and sha256 (its bytes counted); else its problem recorded."""
    try:
        check_size(path, size, entry.bytes)
    except ShardError as e:
        rep.problems.append(Problem.of(e))
        return False
    rep.bytes += size
    if file_sha256(path) != entry.sha256:
        rep.problems.append(Problem(str(path), "sha256 differs from the index (the shard is damaged)"))
        return False
    return True


def check_folder(out: Path, shard_file: ShardFile) -> VerifyReport:
    """Every check of the module docstring on the index files in `out`. Each shard is reached
    through `shard_file(entry)`: a context giving (local path, size; None when missing) and
    holding the file there while it is checked (a remote check downloads one shard at a time)."""
    rep = VerifyReport()
    sums = checksum_problems(out)  # listed last: the specific problems below say more
    manifest_problems: list[Problem] = []
    index = load_index(out, manifest_problems)
    rep.frames = index.num_frames
    rep.problems += manifest_problems
    if not index.episodes:  # what an earlier datakit wrote when every episode was skipped
        rep.problems.append(Problem(str(out / MANIFEST_NAME), "holds no episode: nothing for a reader to read"))
    frames = load_frames(out)
    try:
        check_frames_schema(frames, index, out / FRAMES_NAME)
        rows_usable = True
    except IndexFileError as e:
        if not manifest_problems:
            raise  # a frames table that does not fit a sound manifest: unreadable, exit 2
        rep.problems.append(Problem.of(e))  # most likely the manifest's totals are what is wrong
        rows_usable = False
    if rows_usable and not manifest_problems:  # the row checks rely on the manifest's ranges
        rep.problems += [Problem(str(out / FRAMES_NAME), p) for p in table_problems(index, frames)]
    if rows_usable:  # each column once, not per shard
        cols = {k: column(frames, k) for k in ("shard", "episode_index", "frame_index", "state", "action")}
        offsets = {cam: column(frames, OFFSET_PREFIX + cam) for cam in index.cameras}
    for si, entry in enumerate(index.shards):
        rep.shards += 1
        with shard_file(entry) as (path, size):
            if not shard_intact(path, size, entry, rep):
                continue
            if not rows_usable:
                continue
            problems, checked = _shard_problems(path, size, np.flatnonzero(cols["shard"] == si), index, cols,
                                                offsets)
        rep.problems += problems
        rep.offsets_checked += checked
    rep.problems += sums
    return rep

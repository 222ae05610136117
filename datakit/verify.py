"""`datakit verify OUT`: re-hash every shard and check every indexed offset against the tar structure."""
from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datakit.errors import ShardError
from datakit.shards.index import FRAME_KEY, OFFSET_PREFIX, column, load_frames, load_index
from datakit.durable import file_sha256
from datakit.shards.writer import npy_header


@dataclass
class VerifyReport:
    shards: int = 0
    bytes: int = 0
    frames: int = 0
    offsets_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_shard(path: Path, expected: dict[str, int], header_len: dict[str, int]) -> list[str]:
    """Walk the tar headers: every indexed member must sit exactly at its indexed offset."""
    found: dict[str, int] = {}
    try:
        with tarfile.open(path, "r:") as tf:
            for m in tf:
                found[m.name] = m.offset_data
    except (tarfile.TarError, OSError) as e:
        return [f"{path}: unreadable tar ({e})"]
    problems = []
    for name, off in expected.items():
        if name not in found:
            problems.append(f"{path}: member {name} is missing")
        elif found[name] + header_len[name] != off:
            problems.append(f"{path}: member {name} is at {found[name]}, the index says {off - header_len[name]}")
        if len(problems) > 5:
            break
    return problems


def verify(out: str | Path, progress: bool = False) -> VerifyReport:
    out = Path(out)
    index = load_index(out)
    frames = load_frames(out)
    rep = VerifyReport(frames=index.num_frames)
    if len(frames) != index.num_frames:
        rep.problems.append(f"{out}: frames table has {len(frames)} rows, the manifest says {index.num_frames}")
    shard_col, ep, fr = column(frames, "shard"), column(frames, "episode_index"), column(frames, "frame_index")
    offsets = {cam: column(frames, OFFSET_PREFIX + cam) for cam in index.cameras}  # once, not per shard
    for si, entry in enumerate(index.shards):
        path = out / entry.name
        rep.shards += 1
        if not path.exists():
            rep.problems.append(f"{path}: missing shard file")
            continue
        size = path.stat().st_size
        rep.bytes += size
        if size != entry.bytes:
            rep.problems.append(f"{path}: {size} bytes, the index says {entry.bytes}")
            continue
        if file_sha256(path) != entry.sha256:
            rep.problems.append(f"{path}: sha256 differs from the index (the shard is damaged)")
            continue
        rows = np.flatnonzero(shard_col == si)
        expected: dict[str, int] = {}
        hlen: dict[str, int] = {}
        for cam, c in index.cameras.items():
            offs = offsets[cam]
            h = len(npy_header(tuple(c.frame_shape), np.dtype(np.uint8)))
            for r in rows:
                o = int(offs[r])
                if o < 0:
                    continue
                if o + c.frame_bytes > size:
                    rep.problems.append(f"{path}: offset {o} of {cam} runs past the end of the shard")
                    continue
                name = f"{FRAME_KEY.format(episode=int(ep[r]), frame=int(fr[r]))}.{cam}.npy"
                expected[name], hlen[name] = o, h
        rep.offsets_checked += len(expected)
        rep.problems += _check_shard(path, expected, hlen)
    return rep


def raise_if_damaged(rep: VerifyReport) -> None:
    if rep.problems:
        raise ShardError(rep.problems[0].split(": ")[0], rep.problems[0].split(": ", 1)[1])

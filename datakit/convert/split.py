"""Below the shard: episodes of one shard converted in parallel, then joined into it in order.

A shard is written by one writer, so an engine with fewer shards than workers would leave
workers idle (a one-shard plan converted slower with --workers 2 than with 1: 3.5 s against
2.4 s on 600 frames of 480x640). Instead each episode is converted by any worker into its own
part file (the same tar members convert_episode writes into a shard, offsets counted from the
part's start), and one writer appends the parts to the shard in plan order. Tar members are
position-independent, so the shard is byte for byte the one a single writer makes; an
episode's offsets stay relative to its `base`, which the joiner sets to where the part lands.

    part = write_part(spec, cfg, scratch, shard_index, ref)          # any worker, any machine
    journal, shard = join_parts(cfg, out, shard_index, refs, parts)  # one writer, plan order
    commit_shard(out, shard, journal)                                # fsync, rename, journal

Engines: engines/local_split.py (a process pool on this machine) and engines/ray.py (Ray tasks).
"""
from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from datakit.convert.config import ConvertConfig
from datakit.convert.journal import Journal
from datakit.convert.shard import OutputShard, ShardTally
from datakit.convert.episode import EpisodeResult, convert_episode
from datakit.errors import output_error
from datakit.shards.names import SHARD_PATTERN, STAGING
from datakit.sources.episode import DatasetSpec, EpisodeRef

SCRATCH = "tasks"  # OUT/.datakit-staging/tasks/<attempt>/: one private folder per task attempt
COPY_CHUNK = 64 << 20  # bytes per write of a part into its shard


def scratch_root(out: Path) -> Path:
    """Where task attempts keep their private files (removed with the staging folder)."""
    return Path(out) / STAGING / SCRATCH


def new_scratch(out: Path, what: str) -> Path:
    """A fresh folder for one task attempt: a retried or zombie attempt never shares a file."""
    d = scratch_root(out) / f"{what}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        d.mkdir(parents=True)
    except OSError as e:
        raise output_error(d, e) from e
    return d


def shm_scratch(out: Path, need: int) -> Path | None:
    """A folder on tmpfs for this machine's part files, if /dev/shm has room for `need` bytes
    twice over; else None (use OUT). Named after OUT, so a killed run's leftovers are removed
    by the next run on the same OUT (OUT's lock: no other run is using them)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return None
    folder = shm / f"datakit-parts-{hashlib.sha1(str(Path(out).resolve()).encode()).hexdigest()[:12]}"
    shutil.rmtree(folder, ignore_errors=True)
    try:
        if shutil.disk_usage(shm).free < 2 * need:
            return None
        folder.mkdir()
    except OSError:
        return None
    return folder


def split_below_shard(workers: int, jobs: list[tuple[int, list[EpisodeRef]]]) -> bool:
    """Split into episodes when the shards alone cannot keep `workers` busy."""
    return workers > 1 and len(jobs) < workers and sum(len(refs) for _, refs in jobs) > len(jobs)


class PartFile:
    """An episode's tar members in a file of their own: the sink convert_episode writes into
    (`bytes`, `write`, `truncate`, as a shard), without a hash (the joiner hashes the shard)."""

    def __init__(self, path: Path):
        self.path = path
        self.bytes = 0
        try:
            self.f = open(path, "wb")
        except OSError as e:
            raise output_error(path, e) from e

    def write(self, data: bytes | memoryview) -> int:
        try:
            self.f.write(data)
        except OSError as e:
            raise output_error(self.path, e) from e
        self.bytes += len(data)
        return len(data)

    def truncate(self, size: int) -> None:
        try:
            self.f.flush()
            self.f.truncate(size)
            self.f.seek(size)
        except OSError as e:
            raise output_error(self.path, e) from e
        self.bytes = size

    def close(self) -> None:
        try:
            self.f.close()  # no fsync: the shard it is copied into is fsynced; a crash redoes the episode
        except OSError as e:
            raise output_error(self.path, e) from e


@dataclass
class EpisodePart:
    """One converted episode: its result (offsets relative to the part's start) and its part
    file, or `path=None` when the episode failed (result.error says why; nothing written)."""

    shard: int
    result: EpisodeResult
    path: Path | None


def write_part(spec: DatasetSpec, cfg: ConvertConfig, scratch: Path, shard: int, ref: EpisodeRef,
               progress: Callable[[int], None] = lambda n: None) -> EpisodePart:
    """Convert one episode into `scratch/ep-N.part` (`progress` per frame). A bad input comes
    back in result.error; an OutputError is raised (and the part removed)."""
    path = Path(scratch) / f"ep-{ref.episode_index:06d}.part"
    part = PartFile(path)
    try:
        res = convert_episode(spec, ref, cfg, part, progress)
        part.close()
    except BaseException:
        part.f.close()
        path.unlink(missing_ok=True)
        raise
    if res.error is not None:
        path.unlink(missing_ok=True)
        return EpisodePart(shard, res, None)
    return EpisodePart(shard, res, path)


def _append(shard: OutputShard, path: Path) -> None:
    """Copy a part file into the shard. It is mapped, not read: the one copy is the shard's
    write, and the hasher thread hashes the mapped pages (the views stay valid after the part
    is unlinked, until hashed)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except OSError as e:
        raise output_error(path, e) from e
    for at in range(0, size, COPY_CHUNK):
        shard.write(view[at:at + COPY_CHUNK])


def join_parts(cfg: ConvertConfig, shard_dir: Path, index: int, refs: list[EpisodeRef],
               parts: Iterable[EpisodePart], delete: bool = True) -> tuple[Journal, OutputShard]:
    """Append the parts of shard `index` in plan order into `shard_dir/shard-N.tar.tmp` and
    finish it (end of archive, hash); not committed yet. `parts` may be a generator that waits
    for each episode in turn. Under --on-error fail the first bad episode is raised (the .tmp
    removed); `delete` removes each part once copied (an engine that may retry the join keeps them)."""
    shard = OutputShard(Path(shard_dir) / SHARD_PATTERN.format(index=index))
    tally = ShardTally(index, cfg.on_error)
    try:
        for ref, part in zip(refs, parts, strict=True):
            res = part.result
            if res.episode_index != ref.episode_index or part.shard != index:
                raise ValueError(f"part of episode {res.episode_index} given for episode {ref.episode_index}")
            if not tally.accept(res):
                continue
            res.base = shard.bytes  # the same base the single writer would have given it
            _append(shard, part.path)
            if delete:
                part.path.unlink(missing_ok=True)
            tally.place(res)
        nbytes, sha = shard.finish()
    except BaseException:
        shard.abort()
        raise
    return tally.journal(refs, shard.path.name, nbytes, sha), shard

"""One shard, start to finish: its planned episodes appended to `shard-N.tar.tmp`, then the
commit protocol (fsync, rename to the final name, journal). Plain data in, a Journal out, so
any engine (a local process, a pool worker, a cluster task) converts a shard the same way:

    journal, shard = write_shard(spec, cfg, out, i, refs, progress)   # decode + write
    commit_shard(out, shard, journal)                                 # fsync, rename, journal

Errors: a bad input episode is skipped (--on-error skip, recorded in the journal) or raised
(fail); any OSError while writing OUT is raised as an OutputError naming the file and the
errno, whatever --on-error says, and the unfinished shard is removed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from datakit.convert.config import ConvertConfig
from datakit.convert.journal import Journal, PlacedEpisode, SkippedEpisode, journal_path, write_journal
from datakit.convert.episode import EpisodeResult, convert_episode
from datakit.durable import discard
from datakit.errors import OutputError, output_error
from datakit.shards.names import SHARD_PATTERN
from datakit.shards.writer import ShardFile
from datakit.sources.episode import DatasetSpec, EpisodeRef


class OutputShard(ShardFile):
    """A ShardFile whose OSErrors are output errors: the sink failing (disk full, file too
    large, read-only OUT) must never be taken for a bad input episode."""

    def __init__(self, path: Path):
        try:
            super().__init__(path)
        except OSError as e:
            raise output_error(path.with_name(path.name + ".tmp"), e) from e

    def write(self, data: bytes | memoryview) -> int:
        try:
            return super().write(data)
        except OSError as e:
            raise output_error(self.tmp, e) from e

    def truncate(self, size: int) -> None:
        try:
            super().truncate(size)
        except OSError as e:
            raise output_error(self.tmp, e) from e

    def finish(self) -> tuple[int, str]:
        try:
            return super().finish()
        except OSError as e:
            raise output_error(self.tmp, e) from e

    def commit(self) -> None:
        """fsync + rename; when that fails (ENOSPC can first show at fsync) the temporary file
        is removed, so no engine is left with a stray .tmp after a failed commit."""
        try:
            super().commit()
        except OSError as e:
            try:
                self.f.close()
            except OSError:
                pass
            discard(self.tmp)
            raise output_error(self.path, e) from e

    def abort(self) -> None:
        """Drop the unfinished shard; closing may fail again on a full disk, the unlink must not."""
        try:
            super().abort()
        except OSError:
            discard(self.tmp)


def _placed(res: EpisodeResult, shard: int) -> PlacedEpisode:
    return PlacedEpisode(episode_index=res.episode_index, shard=shard, base=res.base, length=res.length,
                         task=res.task, camera_status=res.camera_status, decoders=res.decoders, offsets=res.offsets,
                         frame_index=res.frame_index, timestamp=res.timestamp, task_index=res.task_index,
                         state=res.state, action=res.action)


@dataclass
class ShardTally:
    """What a shard holds as its episodes arrive in plan order: the placed and the skipped
    episodes and the decoders used. The one home of the --on-error rule for both writers (one
    writer per shard here, parts joined in `split.py`)."""

    index: int
    on_error: str
    placed: list[PlacedEpisode] = field(default_factory=list)
    skipped: list[SkippedEpisode] = field(default_factory=list)
    decoders: dict[str, int] = field(default_factory=dict)

    def accept(self, res: EpisodeResult) -> bool:
        """True for a good episode; a bad one is raised under --on-error fail, else recorded as skipped."""
        if res.error is None:
            return True
        if self.on_error == "fail":
            raise res.error
        self.skipped.append(SkippedEpisode(res.episode_index, res.source, str(res.error), res.trace))
        return False

    def place(self, res: EpisodeResult) -> None:
        self.placed.append(_placed(res, self.index))
        for b in res.decoders.values():
            self.decoders[b] = self.decoders.get(b, 0) + 1

    def journal(self, refs: list[EpisodeRef], name: str, nbytes: int, sha: str) -> Journal:
        planned = [r.episode_index for r in refs]
        return Journal(self.index, planned, name, nbytes, sha, self.placed, self.skipped, self.decoders)


def write_shard(spec: DatasetSpec, cfg: ConvertConfig, out: Path, index: int, refs: list[EpisodeRef],
                progress: Callable[[int], None]) -> tuple[Journal, OutputShard]:
    """Write shard `index` from its planned episodes into `shard-N.tar.tmp` and finish it (end
    of archive, hash); not committed yet. Raises the first bad episode's error under
    --on-error fail, and any OutputError; the .tmp file is removed then."""
    shard = OutputShard(Path(out) / SHARD_PATTERN.format(index=index))
    tally = ShardTally(index, cfg.on_error)
    try:
        for ref in refs:
            res = convert_episode(spec, ref, cfg, shard, progress)  # progress per frame
            if tally.accept(res):
                tally.place(res)
        nbytes, sha = shard.finish()
    except BaseException:
        shard.abort()
        raise
    return tally.journal(refs, shard.path.name, nbytes, sha), shard


def commit_shard(out: Path, shard: ShardFile, j: Journal) -> None:
    """fsync + rename the shard, then journal it (the journal is the proof it is complete)."""
    shard.commit()
    try:
        write_journal(out, j)
    except OSError as e:
        raise output_error(journal_path(out, j.index), e) from e


def is_committed(out: Path, j: Journal) -> bool:
    return (Path(out) / j.name).exists() and journal_path(out, j.index).exists()


def check_committed(out: Path, journals: list[Journal]) -> None:
    """Every shard reported done must be renamed and journaled (a commit can fail late)."""
    missing = [j.name for j in journals if not is_committed(out, j)]
    if missing:
        raise OutputError(Path(out) / missing[0], "shard was written but not committed (fsync/rename/journal "
                          "failed); rerun the same command to redo it")

"""One shard, start to finish: its planned episodes appended to `shard-N.tar.tmp`, then the
commit protocol (fsync, rename to the final name, journal). Plain data in, a Journal out, so
any engine (a local process, a pool worker, a cluster task) converts a shard the same way.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from datakit.config import ConvertConfig
from datakit.convert.journal import Journal, Placed, journal_path, write_journal
from datakit.episode_convert import EpisodeResult, convert_episode
from datakit.errors import DatakitError
from datakit.shards.index import SHARD_PATTERN
from datakit.shards.writer import ShardFile
from datakit.sources.episode import DatasetSpec, EpisodeRef


def convert_shard(spec: DatasetSpec, cfg: ConvertConfig, out: Path, index: int, refs: list[EpisodeRef],
                  progress: Callable[[int], None], closer: ThreadPoolExecutor | None = None) -> Journal | str:
    """Write one shard from its planned episodes; returns its journal, or the error under
    --on-error fail. With a `closer` thread, fsync + rename + journal run there while the
    caller goes on: the caller must shut the closer down before it trusts the shard."""
    shard = ShardFile(out / SHARD_PATTERN.format(index=index))
    placed: list[Placed] = []
    skipped: list[EpisodeResult] = []
    decoders: dict[str, int] = {}
    try:
        for ref in refs:
            res = convert_episode(spec, ref, cfg, shard)
            progress(ref.length)
            if res.error is not None:
                if cfg.on_error == "fail":
                    shard.abort()
                    return res.error
                skipped.append(res)
                continue
            placed.append(Placed(res, index, res.base))
            for b in res.decoders.values():
                decoders[b] = decoders.get(b, 0) + 1
    except BaseException:
        shard.abort()
        raise
    planned = [r.episode_index for r in refs]
    nbytes, sha = shard.finish()
    j = Journal(index, planned, shard.path.name, nbytes, sha, placed, skipped, decoders)
    if closer is None:
        commit_shard(out, shard, j)
        return j
    closer.submit(commit_shard, out, shard, j)
    return j


def commit_shard(out: Path, shard: ShardFile, j: Journal) -> None:
    """fsync + rename the shard, then journal it (the journal is the proof it is complete)."""
    shard.commit()
    write_journal(out, j)


def is_committed(out: Path, j: Journal) -> bool:
    return (out / j.name).exists() and journal_path(out, j.index).exists()


def check_committed(out: Path, journals: list[Journal]) -> None:
    """Every shard reported done must be renamed and journaled (a close can fail, e.g. disk full)."""
    missing = [j.name for j in journals if not is_committed(out, j)]
    if missing:
        raise DatakitError(f"{out / missing[0]}: shard was written but not committed (fsync/rename failed); rerun to redo it")

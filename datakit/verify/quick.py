"""The cheap checks of a finished conversion, for callers that cannot afford `verify`'s re-hash of
every shard: a rerun of `datakit convert` on a finished OUT (before it says "already complete")
and `datakit plan` (before it plans from an index).

- `check_index_files`: index.json and frames.arrow hash to what checksums.json records (two small
  files hashed; `folder.checksum_problems`), so an edited index is never trusted;
- `shard_size_problems`: every shard the index names exists with its indexed size (one stat per
  shard, or one listing of a remote root).

A shard changed in place at its own size passes both: only `datakit verify` (sha256) sees that.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from datakit.durable import check_size
from datakit.errors import IndexFileError, Problem, ShardError
from datakit.shards.index import ShardIndex
from datakit.verify.folder import checksum_problems


def check_index_files(folder: Path, shown: str | None = None) -> None:
    """Raise IndexFileError naming the first index file in `folder` that differs from
    checksums.json (or checksums.json itself, missing or unreadable). `shown`: the name to print
    for `folder` (the URL whose index files were downloaded there)."""
    problems = checksum_problems(Path(folder))
    if problems:
        p = problems[0]
        where = p.where if shown is None else p.where.replace(str(folder), shown.rstrip("/"), 1)
        raise IndexFileError(where, f"{p.what}; refusing an index that is not the conversion's "
                                    f"(`datakit verify` names every problem)")


def shard_size_problems(folder: Path, index: ShardIndex, size_of: Callable[[str], int | None]) -> list[Problem]:
    """A Problem for each shard of `index` whose size (`size_of(name)`, None when there is no
    such file) is not the indexed one; each is named as `folder/<shard>`."""
    problems = []
    for entry in index.shards:
        try:
            check_size(Path(folder) / entry.name, size_of(entry.name), entry.bytes)
        except ShardError as e:
            problems.append(Problem.of(e))
    return problems

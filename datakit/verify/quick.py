"""The cheap checks of a finished conversion, for callers that cannot afford `verify`'s re-hash of
every shard: a rerun of `datakit convert` on a finished OUT, before it says "already complete".

- `folder.checksum_problems`: index.json and frames.arrow hash to what checksums.json records (two
  small files hashed), so an edited index is never trusted (`datakit plan` gets the same check from
  `load_index` / `load_frames`, as every reader);
- `shard_size_problems`: every shard the index names exists with its indexed size (one stat per
  shard, or one listing of a remote root).

A shard changed in place at its own size passes both: only `datakit verify` (sha256) sees that.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from datakit.durable import check_size
from datakit.errors import Problem, ShardError
from datakit.shards.index import ShardIndex


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

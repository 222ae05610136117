"""The resume journal: one small file per committed shard in OUT/.datakit-staging/.

A journal is written after its shard is fsynced and renamed, so its presence (and the shard
hashing to the value it records) proves the shard complete. It also carries what the index
needs of each episode, so a resumed run assembles the index without re-reading the shards.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

from datakit.durable import file_sha256, write_atomic
from datakit.episode_convert import EpisodeResult
from datakit.sources.episode import EpisodeRef

STAGING = ".datakit-staging"
JOURNAL = "shard-{index:06d}.journal"


@dataclass
class Placed:
    """An episode written into a shard at byte offset `base`."""

    result: EpisodeResult
    shard: int
    base: int


@dataclass
class Journal:
    """A closed shard: written to the staging folder after the shard is fsynced and renamed."""

    index: int
    planned: list[int]  # episode indices the plan gave this shard
    name: str
    bytes: int
    sha256: str
    placed: list[Placed]
    skipped: list[EpisodeResult]
    decoders: dict[str, int] = field(default_factory=dict)


def journal_path(out: Path, index: int) -> Path:
    return out / STAGING / JOURNAL.format(index=index)


def write_journal(out: Path, j: Journal) -> None:
    """Record a committed shard (atomically: a journal is whole or absent)."""
    write_atomic(journal_path(out, j.index), pickle.dumps(j, protocol=pickle.HIGHEST_PROTOCOL))


def load_journals(out: Path, plan: list[list[EpisodeRef]]) -> dict[int, Journal]:
    """Journals of shards that are complete, intact (re-hashed) and match the plan."""
    good: dict[int, Journal] = {}
    for i, refs in enumerate(plan):
        p = journal_path(out, i)
        if not p.exists():
            continue
        try:
            with open(p, "rb") as f:
                j: Journal = pickle.load(f)
        except Exception:
            continue
        shard = out / j.name
        if (j.planned == [r.episode_index for r in refs] and shard.exists()
                and shard.stat().st_size == j.bytes and file_sha256(shard) == j.sha256):
            good[i] = j
    return good

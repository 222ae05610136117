"""The resume journal of `datakit encode`: one JSON file per committed feature shard, in the same
staging folder and under the same names as convert's (`convert/journal.py`), written after the
shard is fsynced and renamed. A rerun keeps a shard only if its journal parses, matches the plan
(the same clips, or prompts, in the same order) and the shard still hashes to the recorded sha256;
anything else is encoded again. Plain JSON, every field checked: nothing in OUT runs as code.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from datakit.convert.journal import journal_path
from datakit.durable import file_sha256, write_atomic
from datakit.shards.names import SHARD_PATTERN

JOURNAL_FORMAT = "datakit-encode-journal"
JOURNAL_VERSION = 1


@dataclass
class FeatureJournal:
    index: int  # shard number
    name: str
    bytes: int
    sha256: str
    planned: list[list[Any]]  # the plan it was written for: [episode, start] per clip, or [prompt] per prompt
    offsets: list[dict[str, int]]  # per planned item: field -> data offset ("text" for a prompt)
    tokens: list[int]  # per prompt: real tokens (empty for a clip shard)


def write_journal(out: Path, j: FeatureJournal) -> None:
    body = {"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION, **asdict(j)}
    write_atomic(journal_path(out, j.index), json.dumps(body).encode())


def _valid(d: Any, index: int, planned: list[list[Any]], fields: list[str]) -> bool:
    if not isinstance(d, dict) or d.get("format") != JOURNAL_FORMAT or d.get("version") != JOURNAL_VERSION:
        return False
    if d.get("index") != index or d.get("name") != SHARD_PATTERN.format(index=index) or d.get("planned") != planned:
        return False
    offs, tokens, nbytes = d.get("offsets"), d.get("tokens"), d.get("bytes")
    if not isinstance(nbytes, int) or not isinstance(d.get("sha256"), str) or not isinstance(offs, list):
        return False
    if len(offs) != len(planned) or not isinstance(tokens, list):
        return False
    ints = lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < nbytes  # noqa: E731
    if not all(isinstance(o, dict) and sorted(o) == sorted(fields) and all(map(ints, o.values())) for o in offs):
        return False
    return all(isinstance(t, int) and t > 0 for t in tokens)


def load_journal(out: Path, index: int, planned: list[list[Any]], fields: list[str]) -> FeatureJournal | None:
    """The journal of shard `index` if it is valid for this plan and its shard is intact, else None."""
    try:
        d = json.loads(journal_path(out, index).read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not _valid(d, index, planned, fields):
        return None
    shard = Path(out) / d["name"]
    if not shard.is_file() or shard.stat().st_size != d["bytes"] or file_sha256(shard) != d["sha256"]:
        return None
    return FeatureJournal(**{k: d[k] for k in ("index", "name", "bytes", "sha256", "planned", "offsets", "tokens")})

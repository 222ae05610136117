"""The resume journal: one small JSON file per committed shard in OUT/.datakit-staging/.

A journal is written after its shard is fsynced and renamed, so its presence (and the shard
hashing to the value it records) proves the shard complete. It also carries what the index
needs of each episode, so a resumed run assembles the index without re-reading the shards.

OUT is data, not code: a journal is plain JSON (arrays as lists of numbers), and every field
is checked against a schema and against the plan when it is loaded. A journal that fails any
check is ignored, and its shard is converted again; nothing in it can run code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datakit.durable import file_sha256, write_atomic
from datakit.shards.index import CAMERA_STATUSES
from datakit.shards.names import JOURNAL, SHARD_PATTERN, STAGING
from datakit.sources.episode import EpisodeRef

JOURNAL_FORMAT = "datakit-journal"
JOURNAL_VERSION = 2  # 1 was a pickle (never loaded any more)


@dataclass
class PlacedEpisode:
    """An episode written into shard `shard`, its members starting at byte `base`: all the
    index needs of it."""

    episode_index: int
    shard: int
    base: int
    length: int
    task: str
    camera_status: dict[str, str]  # camera -> real | blank | missing
    decoders: dict[str, str]  # camera -> backend used
    offsets: dict[str, np.ndarray]  # camera -> (T,) int64 pixel offsets relative to `base`, -1 none
    frame_index: np.ndarray  # (T,) int64
    timestamp: np.ndarray  # (T,) float64
    task_index: np.ndarray  # (T,) int64
    state: np.ndarray  # (T, S) float32
    action: np.ndarray  # (T, A) float32


@dataclass
class SkippedEpisode:
    """An episode left out under --on-error skip (bad input), with its one-line reason."""

    episode_index: int
    source: str
    reason: str
    trace: str = ""  # the traceback, shown with --debug


@dataclass
class Journal:
    """A committed shard: written to the staging folder after the shard is fsynced and renamed."""

    index: int
    planned: list[int]  # episode indices the plan gave this shard
    name: str
    bytes: int
    sha256: str
    placed: list[PlacedEpisode]
    skipped: list[SkippedEpisode]
    decoders: dict[str, int] = field(default_factory=dict)  # backend -> camera-episodes decoded


class JournalInvalid(ValueError):
    """A journal that does not match the schema or the plan (treated as absent)."""


def journal_path(out: Path, index: int) -> Path:
    return Path(out) / STAGING / JOURNAL.format(index=index)


def journal_to_json(j: Journal) -> str:
    placed = [{
        "episode_index": p.episode_index, "base": p.base, "length": p.length, "task": p.task,
        "camera_status": p.camera_status, "decoders": p.decoders,
        "offsets": {c: o.tolist() for c, o in p.offsets.items()},
        "frame_index": p.frame_index.tolist(), "timestamp": p.timestamp.tolist(),
        "task_index": p.task_index.tolist(), "state": p.state.tolist(), "action": p.action.tolist(),
    } for p in j.placed]
    skipped = [{"episode_index": s.episode_index, "source": s.source, "reason": s.reason, "trace": s.trace}
               for s in j.skipped]
    return json.dumps({"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION, "index": j.index,
                       "planned": j.planned, "name": j.name, "bytes": j.bytes, "sha256": j.sha256,
                       "decoders": j.decoders, "placed": placed, "skipped": skipped})


def write_journal(out: Path, j: Journal) -> None:
    """Record a committed shard (atomically: a journal is whole or absent)."""
    write_atomic(journal_path(out, j.index), journal_to_json(j).encode())


# ---- loading: every field checked ----------------------------------------------------------

def _need(ok: bool, what: str) -> None:
    if not ok:
        raise JournalInvalid(what)


def _get(d: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    _need(isinstance(d, dict) and key in d, f"missing {key!r}")
    v = d[key]
    _need(isinstance(v, kind) and not (isinstance(v, bool) and kind is not bool), f"{key!r} is not {kind}")
    return v


def _str_map(d: Any, key: str, keys: list[str] | None = None) -> dict[str, str]:
    m = _get(d, key, dict)
    _need(all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()), f"{key!r}: not str -> str")
    if keys is not None:
        _need(sorted(m) == sorted(keys), f"{key!r}: keys {sorted(m)} are not {sorted(keys)}")
    return m


def _vector(v: Any, n: int, dtype: type, what: str) -> np.ndarray:
    _need(isinstance(v, list) and len(v) == n, f"{what}: not a list of {n}")
    ok = (int,) if dtype is np.int64 else (int, float)
    _need(all(isinstance(x, ok) and not isinstance(x, bool) for x in v), f"{what}: not numbers")
    return np.asarray(v, dtype=dtype).reshape(n)


def _matrix(v: Any, n: int, dim: int, what: str) -> np.ndarray:
    _need(isinstance(v, list) and len(v) == n, f"{what}: not {n} rows")
    rows = [_vector(r, dim, np.float64, what) for r in v]
    return np.asarray(rows, dtype=np.float32).reshape(n, dim)


def _placed(d: Any, shard: int, nbytes: int, cameras: list[str], sd: int, ad: int) -> PlacedEpisode:
    n = _get(d, "length", int)
    base = _get(d, "base", int)
    _need(n > 0 and 0 <= base < nbytes, "length/base out of range")
    camera_status = _str_map(d, "camera_status", cameras)
    _need(all(s in CAMERA_STATUSES for s in camera_status.values()), "unknown camera status")
    offs_d = _get(d, "offsets", dict)
    _need(sorted(offs_d) == sorted(cameras), "offsets: wrong cameras")
    offsets = {c: _vector(offs_d[c], n, np.int64, f"offsets/{c}") for c in cameras}
    _need(all(((o == -1) | ((o >= 0) & (o + base < nbytes))).all() for o in offsets.values()), "offset out of range")
    return PlacedEpisode(
        episode_index=_get(d, "episode_index", int), shard=shard, base=base, length=n, task=_get(d, "task", str),
        camera_status=camera_status, decoders=_str_map(d, "decoders"), offsets=offsets,
        frame_index=_vector(_get(d, "frame_index", list), n, np.int64, "frame_index"),
        timestamp=_vector(_get(d, "timestamp", list), n, np.float64, "timestamp"),
        task_index=_vector(_get(d, "task_index", list), n, np.int64, "task_index"),
        state=_matrix(_get(d, "state", list), n, sd, "state"),
        action=_matrix(_get(d, "action", list), n, ad, "action"))


def journal_from_json(text: str, index: int, cameras: list[str], sd: int, ad: int) -> Journal:
    """Parse and check a journal for shard `index`; raises JournalInvalid on anything unexpected."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise JournalInvalid(f"not JSON ({e})") from None
    except RecursionError:  # valid JSON nested deeper than the parser recurses: unreadable, so redone
        raise JournalInvalid("nested too deeply to parse") from None
    _need(isinstance(d, dict) and d.get("format") == JOURNAL_FORMAT and d.get("version") == JOURNAL_VERSION,
          "not a datakit journal of this version")
    _need(_get(d, "index", int) == index, "index differs from the file name")
    name = _get(d, "name", str)
    _need(name == SHARD_PATTERN.format(index=index), f"shard name {name!r} is not this shard's")
    nbytes = _get(d, "bytes", int)
    sha = _get(d, "sha256", str)
    _need(nbytes > 0 and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha), "bytes/sha256 malformed")
    planned = _get(d, "planned", list)
    _need(all(isinstance(e, int) and not isinstance(e, bool) for e in planned), "planned: not ints")
    decoders = _get(d, "decoders", dict)
    _need(all(isinstance(k, str) and isinstance(v, int) for k, v in decoders.items()), "decoders: not str -> int")
    placed = [_placed(p, index, nbytes, cameras, sd, ad) for p in _get(d, "placed", list)]
    skipped = []
    for s in _get(d, "skipped", list):
        skipped.append(SkippedEpisode(_get(s, "episode_index", int), _get(s, "source", str),
                                      _get(s, "reason", str), _get(s, "trace", str)))
    held = sorted([p.episode_index for p in placed] + [s.episode_index for s in skipped])
    _need(held == sorted(planned), "placed + skipped episodes are not the planned ones")
    return Journal(index, planned, name, nbytes, sha, placed, skipped, decoders)


def load_journals(out: Path, plan: list[list[EpisodeRef]], cameras: list[str], state_dim: int,
                  action_dim: int) -> dict[int, Journal]:
    """Journals of shards that are complete, intact (re-hashed) and match the plan; any other
    journal is ignored, so its shard is converted again."""
    good: dict[int, Journal] = {}
    for i, refs in enumerate(plan):
        p = journal_path(out, i)
        if not p.is_file():
            continue
        try:
            j = journal_from_json(p.read_text(), i, cameras, state_dim, action_dim)
        except (OSError, UnicodeDecodeError, JournalInvalid):
            continue
        lengths = {r.episode_index: r.length for r in refs}
        if j.planned != [r.episode_index for r in refs] or any(lengths[e.episode_index] != e.length for e in j.placed):
            continue
        shard = Path(out) / j.name
        if shard.is_file() and shard.stat().st_size == j.bytes and file_sha256(shard) == j.sha256:
            good[i] = j
    return good

"""The source fingerprint: what a conversion was made from, so one OUT never mixes two datasets.

Recorded in the staging folder when a conversion starts and in the index
(`index.source["fingerprint"]`) when it ends; a rerun into the same OUT (resume, or "already
complete") must present the same fingerprint, else it is refused, naming what differs.

What it holds:
- the dataset's declared schema: format, version, fps, cameras, state/action names, tasks;
- per episode: its index and rows, its table file's size and SHA-256 (the content, so a copy of
  the dataset still matches), and each camera's video file size and mtime (a content hash of
  every video would cost a read of the whole dataset).

Not the decoder: every backend decodes to the same bytes (tests/datakit/convert/test_convert_decoder_identity.py),
so `--decoder` and the ranking file `--decoder auto` reads change neither the shards nor the
index. Fingerprints recorded before that (they held a "decoder" entry) still match.

Table hashing runs on a thread pool (hashlib releases the GIL); a file shared by many episodes
(LeRobot v3.0) is hashed once.
"""
from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from datakit.durable import file_sha256
from datakit.errors import SourceError
from datakit.machine import available_cpus
from datakit.sources.episode import DatasetSpec, EpisodeRef

FINGERPRINT_VERSION = 1


def _table_files(source: Path) -> list[Path]:
    """The files that hold an episode's table: the file itself, or a folder's own files (DROID:
    metadata json + trajectory.h5; the videos below it are fingerprinted separately)."""
    if source.is_dir():
        return sorted(p for p in source.iterdir() if p.is_file())
    return [source]


def _table_print(source: Path) -> list[Any]:
    """[bytes, sha256] of an episode's table file(s)."""
    files = _table_files(source)
    try:
        if len(files) == 1 and files[0] == source:
            return [source.stat().st_size, file_sha256(source)]
        h = hashlib.sha256()
        size = 0
        for f in files:
            size += f.stat().st_size
            h.update(f"{f.name}\0{file_sha256(f)}\0".encode())
        return [size, h.hexdigest()]
    except OSError as e:
        raise SourceError(source, f"cannot read the episode table ({e.strerror or e})") from None


def _video_print(path: Path) -> list[int] | None:
    """[bytes, mtime_ns] of a video file, None when it is missing (a bad episode, found later)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def source_fingerprint(spec: DatasetSpec) -> dict[str, Any]:
    """The fingerprint of a scanned source (plain JSON data)."""
    sources = list(dict.fromkeys(Path(r.source) for r in spec.episodes))
    with ThreadPoolExecutor(min(8, available_cpus())) as ex:
        tables = dict(zip(sources, ex.map(_table_print, sources)))
    cams = list(spec.cameras)
    episodes = []
    for r in spec.episodes:
        videos = [_video_print(Path(r.videos[c].path)) if r.videos.get(c) is not None else None for c in cams]
        episodes.append([r.episode_index, r.length, *tables[Path(r.source)], videos])
    dataset = {
        "format": spec.format, "version": spec.version, "fps": spec.fps,
        "cameras": {c: [s.height, s.width, s.storage] for c, s in spec.cameras.items()},
        "state_names": list(spec.state_names), "action_names": list(spec.action_names),
        "tasks_sha256": hashlib.sha256(json.dumps(spec.tasks).encode()).hexdigest(),
    }
    return {"version": FINGERPRINT_VERSION, "dataset": dataset, "episodes": episodes}


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _episode_diff(old: list, new: list, ref: EpisodeRef, cams: list[str]) -> str | None:
    ep = ref.episode_index
    if old[0] != new[0]:
        return f"episode #{ep}: the earlier source had episode {old[0]} here"
    if old[1] != new[1]:
        return f"episode {ep}: {old[1]} rows before, {new[1]} now"
    if old[2:4] != new[2:4]:
        return f"episode {ep}: table {ref.source} differs in content (size {old[2]} -> {new[2]} bytes)"
    for cam, a, b in zip(cams, old[4], new[4]):
        if a != b:
            path = ref.videos[cam].path if ref.videos.get(cam) is not None else "(no video)"
            what = "size" if (a is None or b is None or a[0] != b[0]) else "modification time"
            return f"episode {ep}: video {path} differs ({what})"
    return None


def fingerprint_diff(old: Any, new: dict[str, Any], spec: DatasetSpec) -> str | None:
    """None when `old` (read from OUT: untrusted, any shape) equals `new`, else what differs
    first, naming the episode and file, and how many episodes differ in all."""
    if isinstance(old, dict) and "decoder" in old:  # recorded before the decoder left the identity
        old = {k: v for k, v in old.items() if k != "decoder"}
    if old == new:
        return None
    try:
        if old.get("version") != new["version"]:
            return "the earlier fingerprint has another format version"
        for key, v in new["dataset"].items():
            if old["dataset"].get(key) != v:
                return f"dataset {key} differs: {_short(old['dataset'].get(key))} before, {_short(v)} now"
        if len(old["episodes"]) != len(new["episodes"]):
            return f"{len(old['episodes'])} episodes before, {len(new['episodes'])} now"
        cams = list(new["dataset"]["cameras"])
        diffs = [d for o, n, r in zip(old["episodes"], new["episodes"], spec.episodes)
                 if (d := _episode_diff(o, n, r, cams)) is not None]
        if diffs:
            more = f" (and {len(diffs) - 1} more episode(s))" if len(diffs) > 1 else ""
            return diffs[0] + more
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        return "the earlier fingerprint is unreadable"
    return "the fingerprints differ"


def fingerprint_digest(fp: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a fingerprint (a short name for it)."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


__all__ = ["fingerprint_diff", "fingerprint_digest", "source_fingerprint"]

"""Checks that need every episode's audit at once, run in the parent after the pool:

- `constant_column` (warning): a state/action column with one value in every frame of every
  episode: no signal, and a zero std that normalisation divides by.
- `unused_task` (warning): a declared task that no frame uses (judged only when every table
  could be read).
- `duplicate_episode_content` (warning): an episode whose state and action values equal another
  episode's, frame for frame: the same recording listed twice, which doubles its weight in
  training (reported at the later episode, naming the earlier).
"""
from __future__ import annotations

import numpy as np

from datakit import source_paths
from datakit.commands.doctor.episode import ColumnRange, EpisodeAudit
from datakit.sources.checks import WARNING, Finding
from datakit.sources.episode import DatasetSpec


def _constant_columns(spec: DatasetSpec, audits: list[EpisodeAudit]) -> list[Finding]:
    """State/action columns with one value over the whole dataset."""
    where = str(spec.root / source_paths.LEROBOT_INFO) if spec.format == "lerobot" else str(spec.root)
    out = []
    for name, names in (("state", spec.state_names), ("action", spec.action_names)):
        ranges = [getattr(a, name) for a in audits if getattr(a, name) is not None]
        if not ranges:
            continue
        total: ColumnRange = ranges[0]
        for r in ranges[1:]:
            total = total.merge(r)
        for d in np.flatnonzero(total.low == total.high):
            col = names[d] if d < len(names) else str(d)
            out.append(Finding("constant_column", where, f"{name} column {col!r} is {total.low[d]:g} in every frame "
                                                         f"of every episode", severity=WARNING))
    return out


def _tasks_file(spec: DatasetSpec) -> str:
    if spec.format != "lerobot":
        return str(spec.root)
    return str(spec.root / (source_paths.LEROBOT_V3_TASKS if spec.version == "v3.0" else source_paths.LEROBOT_V2_TASKS))


def _unused_tasks(spec: DatasetSpec, audits: list[EpisodeAudit]) -> list[Finding]:
    """Tasks declared but used by no frame (only judged when every table could be read)."""
    if any(a.state is None for a in audits):
        return []
    used = {t for a in audits for t in a.tasks_used}
    return [Finding("unused_task", _tasks_file(spec), f"task {i} {text!r} is used by no episode", severity=WARNING)
            for i, text in enumerate(spec.tasks) if i not in used]


def _duplicate_content(spec: DatasetSpec, audits: list[EpisodeAudit]) -> list[Finding]:
    """Episodes whose table digest equals an earlier episode's."""
    first: dict[str, EpisodeAudit] = {}
    sources = {ref.episode_index: str(ref.source) for ref in spec.episodes}
    out = []
    for a in audits:
        if a.table_digest is None:
            continue
        if a.table_digest in first:
            e0 = first[a.table_digest].episode_index
            out.append(Finding("duplicate_episode_content", sources.get(a.episode_index, str(spec.root)),
                               f"episode {a.episode_index} has the same state and action values in every frame "
                               f"as episode {e0} (the same recording twice?)", a.episode_index, None, WARNING))
        else:
            first[a.table_digest] = a
    return out


def dataset_findings(spec: DatasetSpec, audits: list[EpisodeAudit]) -> list[Finding]:
    """Every dataset-wide finding, from the per-episode audits (in spec order)."""
    return _constant_columns(spec, audits) + _unused_tasks(spec, audits) + _duplicate_content(spec, audits)


__all__ = ["dataset_findings"]

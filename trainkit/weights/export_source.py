"""`trainkit export --source NAME`: which robot of a mixture's run an export is for.

A run on a weighted mixture (`[[data.sources]]`, trainkit/config/data.py) normalised each source
with its own statistics and mapped each source's cameras to the model's slots its own way
(datakit/loader/normalise.py `from_sources`, trainkit/data.py), so no one config.json and statistics
serve all of them: an export is for one source, named as the run names it (its `name`, else its
folder's basename: the loss/<name> metrics' names). Without --source a mixture's export is refused
naming the choices; --source on a one-folder run is refused too.
"""
from __future__ import annotations

from pathlib import Path

from trainkit.config import RunConfig
from trainkit.config.data import SourceConfig
from trainkit.errors import CheckpointError


def chosen_source(cfg: RunConfig, source: str | None, run_dir: str | Path) -> SourceConfig | None:
    """The [[data.sources]] table `source` names (None for a one-folder run without --source); a
    mixture without --source, an unknown name, or --source on one folder: one line naming the choices."""
    names = [s.label for s in cfg.data.sources]
    if not names:
        if source is not None:
            raise CheckpointError(str(run_dir), f"--source {source!r}: the run trained on one dataset "
                                  f"({cfg.data.shards}), not a mixture; export it without --source")
        return None
    choices = ", ".join(names)
    if source is None:
        raise CheckpointError(str(run_dir), f"trained on a mixture of {len(names)} datasets, each with its own "
                              f"cameras and statistics: export one robot's policy with --source NAME "
                              f"(NAME: {choices})")
    if source not in names:
        raise CheckpointError(str(run_dir), f"--source {source!r}: not a source of the run's mixture "
                              f"(its sources: {choices})")
    return cfg.data.sources[names.index(source)]


def source_notes(mine: SourceConfig) -> list[str]:
    """What a user serving a source's export must know beyond config.json (README.txt and stderr)."""
    notes = [f"this policy is for source {mine.label!r} of the run's mixture ({mine.shards}): its cameras, "
             f"state/action sizes and statistics; each other source needs its own export (--source)"]
    if mine.prompt:
        notes.append(f"the run trained this source with the task text {mine.prompt!r} for every sample (its "
                     f"[[data.sources]] prompt): serve it with that task")
    return notes

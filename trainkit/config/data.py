"""The `[data]` section of the training config (trainkit/config/load.py loads it with the rest): one shard
folder, or a weighted mixture of them.

A mixture is `data.shards = {"droid/" = 0.7, "libero/" = 0.3}` (also as an override:
`--set 'data.shards={"a/" = 0.7, "b/" = 0.3}'`) or `[[data.sources]]` tables with per-source slots
and prompt (`SourceConfig`); `loader_sources` turns either into the loader's `MixtureSource` list.
One file giving both forms is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Literal

from trainkit.config.checks import check_choices, check_finite
from trainkit.errors import ConfigError

if TYPE_CHECKING:
    from datakit.loader.mixture import MixtureSource

DATA_FORMS = ("shards", "sources")  # data.shards (one folder or {path = weight}) or [[data.sources]]: one of the two
# datakit.loader.config's SHUFFLE_MODES / NORM_MODES (importing it would import the loader and
# torch into every config load; tests/trainkit/config/test_trainkit_config.py checks the two stay equal)
Shuffle = Literal["random", "shard_block", "sequential"]
Norm = Literal["mean_std", "quantile", "none"]


@dataclass(kw_only=True)
class SourceConfig:
    """One dataset of a mixture, a `[[data.sources]]` table (docs/training.md, "Mixtures")."""

    shards: str = ""  # its shard folder or fsspec URL (required)
    weight: float = 0.0  # its share of the samples (required, > 0); the weights are normalised to sum 1
    name: str = ""  # what its metrics are called (loss/<name>); "": the folder's basename
    # This dataset's cameras filling the model's slots, in slot order, "" for a slot it leaves empty
    # (datasets name their cameras differently); []: data.slots, as for one folder.
    slots: list[str] = field(default_factory=list)
    prompt: str = ""  # task text for every sample of this source instead of the dataset's; "": the dataset's
    # This source's validation episodes (its episode_index), held out of training and validated on
    # (trainkit/validation.py); a mixture's form of data.val_episodes. []: none (or data.val_fraction's).
    val_episodes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        # ValueError: the loader names the table (data.sources[i]: ...)
        if not self.shards:
            raise ValueError("shards is required (the source's shard folder or URL)")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"weight must be a number > 0 (weights are normalised to sum 1), got {self.weight}")
        bad = [e for e in self.val_episodes if isinstance(e, bool) or not isinstance(e, int) or e < 0]
        if bad:
            raise ValueError(f"val_episodes are episode_index numbers >= 0, got {bad[0]!r}")

    @property
    def label(self) -> str:
        """The source's name: `name`, else its folder's basename."""
        return self.name or source_name(self.shards)


@dataclass(kw_only=True)
class DataConfig:
    # A datakit shard folder (index.json + shard-*.tar), or an fsspec URL of one (s3://, gs://):
    # whole shards are then downloaded into a node-local cache (docs/scale-out.md). A table
    # {path = weight, ...} is a weighted mixture, stored as `sources` (one table per path).
    shards: str | dict[str, float] = ""
    # A weighted mixture of shard folders, `[[data.sources]]` tables (SourceConfig); either this or
    # `shards`, not both. One sample order over all of them; each keeps its own statistics and slots.
    sources: list[SourceConfig] = field(default_factory=list)
    # The frame rate the sample windows use when a mixture's sources differ; 0: the sources' own,
    # which must then agree
    fps: float = 0.0
    cache_dir: str = ""  # URL shards: the node's cache folder; "": $DATAKIT_CACHE or ~/.cache/datakit/shards
    cache_bytes: int = 0  # URL shards: cache size limit; 0: half the free space of its disk
    # The model's image slots in order, each a camera of the index or "" for a slot the dataset
    # never fills; empty list: one slot per index camera, in index order. A mixture's sources
    # without their own `slots` use it.
    slots: list[str] = field(default_factory=list)
    prune_slots: bool = True  # drop per batch the slots no sample fills (fewer image tokens)
    h2d_dtype: Literal["uint8", "float32"] = "uint8"  # "uint8": normalise on the GPU; "float32": on the host (baseline)
    # loader worker processes per rank; -1 (default): what the cores allow, min(4, cores per rank - 1)
    # (`workers_for`: 1 on a 2-core machine, where 4 workers warned and crawled)
    num_workers: int = -1
    prefetch_factor: int = 2  # batches each worker keeps ready
    # The interpreter's GIL switch interval while training, in ms (0: Python's own, 5 ms): the loader's
    # feeder thread (prompt tokens, staging) hands the GIL back to the launching thread sooner
    gil_switch_ms: float = 0.0
    shuffle: Shuffle = "random"  # datakit sampler mode
    norm: Norm = "quantile"  # state/action normalisation with the index stats (Pi0.5: quantile)
    # Validation: whole episodes held out of training (trainkit/validation.py), named by their
    # episode_index, or a fraction of the episodes spread evenly over the index; at most one of the two.
    # A mixture: val_fraction holds out that fraction of each source's episodes; episodes by name are
    # per source (`val_episodes` in a [[data.sources]] table), never data.val_episodes.
    val_episodes: list[int] = field(default_factory=list)
    val_fraction: float = 0.0  # in [0, 1); 0 and no val_episodes: no holdout, no validation loss
    # Whose statistics: "dataset" (the shard index's) or "checkpoint" (model.init_from's
    # policy_preprocessor.json or openpi assets/*/norm_stats.json: what the checkpoint was trained with)
    norm_from: Literal["dataset", "checkpoint"] = "dataset"
    # A feature folder (`datakit encode`) as data.shards: the VAE it must have been encoded with (the
    # digest `datakit encode` records as fingerprint.vae); "": any VAE whose latents fit the model
    features_vae: str = ""

    def __post_init__(self) -> None:
        check_choices(self, "data")
        if isinstance(self.shards, dict):  # the short form of a mixture: one source per path
            if self.sources:
                raise ConfigError("data.sources", "set data.shards or [[data.sources]], not both")
            if not self.shards:
                raise ConfigError("data.shards", "an empty table: name at least one shard folder {path = weight}")
            for path, weight in self.shards.items():
                if not (math.isfinite(weight) and weight > 0):
                    raise ConfigError(f"data.shards.{path}", f"weight must be a number > 0 (weights are "
                                      f"normalised to sum 1), got {weight}")
            self.sources, self.shards = [SourceConfig(shards=p, weight=w) for p, w in self.shards.items()], ""
        if self.shards and self.sources:
            raise ConfigError("data.sources", "set data.shards or [[data.sources]], not both")
        names: dict[str, str] = {}
        for s in self.sources:
            if s.label in names:
                raise ConfigError("data.sources", f"two sources are named {s.label!r} ({names[s.label]}, {s.shards}); "
                                  f"give each a distinct name ([[data.sources]] name = ...)")
            names[s.label] = s.shards
        if self.sources and self.val_episodes:
            raise ConfigError("data.val_episodes", "a mixture names its validation episodes per source (val_episodes "
                              "= [...] in a [[data.sources]] table), or holds out data.val_fraction of each")
        if self.val_fraction and any(s.val_episodes for s in self.sources):
            raise ConfigError("data.val_fraction", "set data.val_fraction (of every source) or the sources' "
                              "val_episodes, not both")
        if self.sources and self.norm_from == "checkpoint":
            raise ConfigError("data.norm_from", "'checkpoint' gives every source one robot's statistics; a mixture "
                              "normalises each source with its own (\"dataset\")")
        check_finite("data.fps", self.fps, low=0.0, what="a frame rate >= 0 (0: the sources' own)")
        check_finite("data.val_fraction", self.val_fraction, low=0.0, high=0.99, what="a number in [0, 0.99]")
        if self.val_episodes and self.val_fraction:
            raise ConfigError("data.val_fraction", "set data.val_episodes or data.val_fraction, not both")
        if self.num_workers < -1 or self.prefetch_factor < 1:
            raise ConfigError("data.num_workers", "needs num_workers >= 0 (-1: what the cores allow) and "
                              "prefetch_factor >= 1")
        check_finite("data.gil_switch_ms", self.gil_switch_ms, low=0.0, high=100.0,
                     what="milliseconds in [0, 100] (0: the interpreter's own interval)")
        if self.cache_bytes < 0:
            raise ConfigError("data.cache_bytes", "needs cache_bytes >= 0 (0: half the free disk space)")

    @property
    def holds_out(self) -> bool:
        """Whether the run holds episodes out for validation (data.val_*, a source's val_episodes)."""
        return bool(self.val_episodes or self.val_fraction or any(s.val_episodes for s in self.sources))

    @property
    def roots(self) -> list[str]:
        """Every shard folder or URL the run reads: `shards`, or each source's."""
        return [s.shards for s in self.sources] if self.sources else [self.shards] if self.shards else []


def source_name(root: str) -> str:
    """A source's default name: the last part of its folder path or URL ("data/droid/" -> "droid")."""
    return PurePosixPath(root.rstrip("/").split("://")[-1]).name or root


def loader_sources(dcfg: DataConfig) -> list[MixtureSource]:
    """A mixture's sources (data.shards = {path = weight} or [[data.sources]]) as the loader's
    (datakit.loader.mixture): each with its name filled in (the one its loss/<name> metrics use),
    slots "" -> None, prompt "" -> None; [] for one folder."""
    from datakit.loader.mixture import MixtureSource  # the loader (and torch) only where a run needs it

    return [MixtureSource(root=s.shards, weight=s.weight, name=s.label, prompt=s.prompt or None,
                          slots=tuple(c or None for c in s.slots) or None) for s in dcfg.sources]

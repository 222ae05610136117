"""A validation loss on held-out episodes, comparable across runs, resumes and families.

    split = holdout(cfg.data, shards.index)          # whole episodes: (train episodes, val episodes)
    val = Validation(cfg, shards, fam, model_cfg, split.val, ...)
    loss = val.loss(model, cast)                       # the mean loss over a fixed set of samples

- Whole episodes are held out, never frames of a training episode: `data.val_episodes` names them
  (by episode_index), `data.val_fraction` takes round(f x E) of the E episodes (at least 1),
  spread evenly over the index (positions floor((i + 1/2) E / n)), so the choice depends on the
  dataset alone. The training stream samples the other episodes only (datakit's
  `LoaderConfig.episodes`), and every window is clamped to its anchor's episode.
- Fixed samples, noise and time: the validation samples are the first `train.eval_batches`
  micro-batches per rank of one fixed order (`VAL_SEED`, not the run's seed), and their flow noise
  and time come from the batch generators of that order, so every evaluation of every run on the
  same shards and world size sees the same inputs, and a resumed run's validation loss equals the
  unbroken run's.
- The loss is the family's training loss (the model's forward) under no_grad and `model.eval()`,
  averaged over the micro-batches and the ranks.
- A mixture (`plan_validation`): each source's own split (its [[data.sources]] `val_episodes`, or
  data.val_fraction of its episodes by the rule above), its training episodes given to the loader
  per source (`MixtureSource.episodes`), and a `MixtureValidation`: one `Validation` per validated
  source, `val_loss/<name>` each and `val_loss` their mixture-weight-weighted mean.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from datakit.shards.features import load_clips
from datakit.shards.index import ShardIndex
from trainkit.config import DataConfig, RunConfig, SourceConfig
from trainkit.data import MixtureShards, Shards, TrainData
from trainkit.optim.ema import WeightEMA
from trainkit.errors import DataError
from trainkit.models import Family

VAL_SEED = 0x7A1  # the validation order and noise: one stream for every run, whatever train.seed


@dataclass(frozen=True)
class Split:
    """Episodes (episode_index) of the training stream (None: all) and of validation (empty: none)."""

    train: tuple[int, ...] | None
    val: tuple[int, ...]


def holdout(dcfg: DataConfig, index: ShardIndex | None, source: SourceConfig | None = None, *,
            episodes: Sequence[int] | None = None) -> Split:
    """The episodes held out by `data.val_episodes` / `data.val_fraction` (`source`: of a mixture's
    source, by its own `val_episodes` or data.val_fraction of its episodes: the same rule as one
    folder's); DataError for an episode the index lacks or a holdout that leaves no training episode.
    `episodes`: the folder's episodes in order when `index` is not a shard index (a feature folder's,
    `feature_episodes`)."""
    named, where = (source.val_episodes, source.shards) if source is not None else (dcfg.val_episodes, dcfg.shards)
    key = f"the source's val_episodes ({source.label})" if source is not None else "data.val_episodes"
    if not (named or dcfg.val_fraction):  # no holdout
        return Split(train=None, val=())
    episodes = list(episodes) if episodes is not None else [e.episode_index for e in index.episodes]
    if named:
        missing = sorted(set(named) - set(episodes))
        if missing:
            raise DataError(where, f"{key} names episodes {missing[:8]}, which the index lacks "
                            f"(it has {len(episodes)}: {episodes[:8]}{' ...' if len(episodes) > 8 else ''})")
        val = tuple(sorted(set(named)))
    else:
        n = max(1, round(dcfg.val_fraction * len(episodes)))
        val = tuple(sorted({episodes[int((i + 0.5) * len(episodes) / n)] for i in range(n)}))
    train = tuple(e for e in episodes if e not in set(val))
    if not train:
        raise DataError(where, f"the holdout takes all {len(episodes)} episodes; leave some to train on")
    return Split(train=train, val=val)


def feature_episodes(shards: Shards) -> list[int]:
    """A feature folder's episodes, each once, in the order of its clips (the order of the shard index it
    was encoded from), so `holdout`'s val_fraction picks the episodes it picks on that shard folder."""
    # its checksums are checked where the loader opens it
    ep = load_clips(shards.folder, shards.index, against_checksums=False).column("episode_index").to_numpy()
    _, first = np.unique(ep, return_index=True)
    return [int(ep[i]) for i in sorted(first)]


def source_holdouts(dcfg: DataConfig, shards: MixtureShards) -> tuple[Split, ...]:
    """Each mixture source's split (`holdout` with its table), in source order."""
    return tuple(holdout(dcfg, part.index, src) for src, part in zip(dcfg.sources, shards.parts))


def with_episodes(shards: MixtureShards, episodes: Sequence[tuple[int, ...] | None]) -> MixtureShards:
    """The same opened sources, each sampling only its `episodes` (None: all of its own)."""
    return dataclasses.replace(shards, sources=tuple(dataclasses.replace(s, episodes=e)
                                                      for s, e in zip(shards.sources, episodes)))


def plan_validation(cfg: RunConfig, shards: Shards | MixtureShards, fam: Family, model_cfg: Any, *, rank: int,
                    world_size: int, device: torch.device, image_dtype: torch.dtype
                    ) -> tuple[Shards | MixtureShards, tuple[int, ...] | None, Validation | MixtureValidation | None]:
    """(the training stream's shards, its episodes, the validation or None without a holdout): one
    folder's split by `holdout`, a mixture's per source (each source then samples its training episodes)."""
    kw = dict(rank=rank, world_size=world_size, device=device, image_dtype=image_dtype)
    if isinstance(shards, MixtureShards):
        splits = source_holdouts(cfg.data, shards)
        val = MixtureValidation(cfg, shards, splits, fam, model_cfg, **kw) if any(s.val for s in splits) else None
        return with_episodes(shards, [s.train for s in splits]), None, val
    held = shards.features and cfg.data.holds_out  # a feature folder's episodes: read only for a holdout
    split = holdout(cfg.data, shards.index, episodes=feature_episodes(shards) if held else None)
    return shards, split.train, Validation(cfg, shards, fam, model_cfg, split.val, **kw) if split.val else None


class Validation:
    """The fixed validation batches of one rank, and the loss of a model over them."""

    def __init__(self, cfg: RunConfig, shards: Shards | MixtureShards, fam: Family, model_cfg: Any,
                 episodes: tuple[int, ...] | None, *,
                 rank: int, world_size: int, device: torch.device, image_dtype: torch.dtype):
        self.batches = cfg.train.eval_batches
        self.world_size = world_size
        self.micro_batch = cfg.train.micro_batch
        dcfg = dataclasses.replace(cfg.data, num_workers=0, shuffle="random")  # a few batches: no worker start-up
        self.data = TrainData(dcfg, shards, fam, model_cfg, seed=VAL_SEED, rank=rank, world_size=world_size,
                              micro_batch=cfg.train.micro_batch, device=device, image_dtype=image_dtype,
                              episodes=episodes)
        self.start = self.data.state_dict()

    @property
    def samples(self) -> int:
        """Samples one evaluation covers, over all ranks."""
        return self.batches * self.micro_batch * self.world_size

    @torch.no_grad()
    def loss(self, model: nn.Module, cast: Any) -> float:
        """The mean loss of `model` over the validation batches (collective under torch.distributed)."""
        self.data.load_state_dict(self.start)
        stream = self.data.batches()
        was_training = model.training
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.data.device)
        try:
            for _ in range(self.batches):
                batch = next(stream)
                with cast:
                    total += model(batch.model).detach().double()
        finally:
            stream.close()
            model.train(was_training)
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(total)
        return total.item() / (self.batches * self.world_size)

    def record(self, step: int, model: nn.Module, cast: Any, ema: WeightEMA | None = None) -> dict[str, Any]:
        """The validation record after `step`: the trained weights' loss, and the EMA's with one."""
        rec: dict[str, Any] = {"step": step, "val_loss": self.loss(model, cast)}
        if ema is not None:
            with ema.swapped_in():
                rec["val_loss_ema"] = self.loss(model, cast)
        return {**rec, "samples": self.samples}


class MixtureValidation:
    """A mixture's validation: per source with held-out episodes, a `Validation` of its own (the
    source alone, its held-out episodes, its slots, prompt and statistics, its state and action padded
    to the mixture's widths as in training, `train.eval_batches` micro-batches per rank whatever its
    weight), so every source's loss is measured on as many samples.

    The record's `val_loss/<name>` is a source's loss; `val_loss` is their mean weighted by the
    sources' mixture weights (renormalised over the validated sources): the loss the training
    mixture optimises, not the sample-weighted mean (which, each source counting the same samples,
    would be the plain mean). `val_loss_ema` and `val_loss_ema/<name>` likewise with an EMA.
    """

    def __init__(self, cfg: RunConfig, shards: MixtureShards, splits: Sequence[Split], fam: Family, model_cfg: Any, *,
                 rank: int, world_size: int, device: torch.device, image_dtype: torch.dtype):
        held = [(src, part, split.val) for src, part, split in zip(shards.sources, shards.parts, splits) if split.val]
        total = sum(src.weight for src, _, _ in held)
        self.weights = {src.name: src.weight / total for src, _, _ in held}
        # padded to the whole mixture's state/action widths, as its items are in the training batches
        # (Pi0.5's prompt holds a token per state channel, padding included)
        widths = (max(len(p.index.state_names) for p in shards.parts),
                  max(len(p.index.action_names) for p in shards.parts))
        self.parts = {src.name: Validation(cfg, MixtureShards(sources=(dataclasses.replace(src, episodes=val),),
                                                              parts=(part,), fps=shards.fps, widths=widths),
                                           fam, model_cfg, None, rank=rank, world_size=world_size, device=device,
                                           image_dtype=image_dtype)
                      for src, part, val in held}

    @property
    def samples(self) -> int:
        """Samples one evaluation covers, over all ranks and sources."""
        return sum(v.samples for v in self.parts.values())

    def losses(self, model: nn.Module, cast: Any, key: str = "val_loss") -> dict[str, float]:
        """{key: the weighted mean, key/<name>: each source's loss} (collective under torch.distributed)."""
        each = {name: v.loss(model, cast) for name, v in self.parts.items()}
        return {key: sum(self.weights[name] * loss for name, loss in each.items()),
                **{f"{key}/{name}": loss for name, loss in each.items()}}

    def record(self, step: int, model: nn.Module, cast: Any, ema: WeightEMA | None = None) -> dict[str, Any]:
        """`Validation.record`'s, with each source's loss beside the weighted mean."""
        rec: dict[str, Any] = {"step": step, **self.losses(model, cast)}
        if ema is not None:
            with ema.swapped_in():
                rec.update(self.losses(model, cast, "val_loss_ema"))
        return {**rec, "samples": self.samples}

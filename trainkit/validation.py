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
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from datakit.shards.index import ShardIndex
from trainkit.config import DataConfig, RunConfig
from trainkit.data import Shards, TrainData
from trainkit.optim.ema import WeightEMA
from trainkit.errors import DataError
from trainkit.models import Family

VAL_SEED = 0x7A1  # the validation order and noise: one stream for every run, whatever train.seed


@dataclass(frozen=True)
class Split:
    """Episodes (episode_index) of the training stream (None: all) and of validation (empty: none)."""

    train: tuple[int, ...] | None
    val: tuple[int, ...]


def holdout(dcfg: DataConfig, index: ShardIndex) -> Split:
    """The episodes held out by `data.val_episodes` / `data.val_fraction`; DataError for an episode
    the index lacks or a holdout that leaves no training episode."""
    if not (dcfg.val_episodes or dcfg.val_fraction):  # no holdout (a feature folder has no episode list)
        return Split(train=None, val=())
    episodes = [e.episode_index for e in index.episodes]
    if dcfg.val_episodes:
        missing = sorted(set(dcfg.val_episodes) - set(episodes))
        if missing:
            raise DataError(dcfg.shards, f"data.val_episodes names episodes {missing[:8]}, which the index lacks "
                            f"(it has {len(episodes)}: {episodes[:8]}{' ...' if len(episodes) > 8 else ''})")
        val = tuple(sorted(set(dcfg.val_episodes)))
    elif dcfg.val_fraction:
        n = max(1, round(dcfg.val_fraction * len(episodes)))
        val = tuple(sorted({episodes[int((i + 0.5) * len(episodes) / n)] for i in range(n)}))
    train = tuple(e for e in episodes if e not in set(val))
    if not train:
        raise DataError(dcfg.shards, f"the holdout takes all {len(episodes)} episodes; leave some to train on")
    return Split(train=train, val=val)


class Validation:
    """The fixed validation batches of one rank, and the loss of a model over them."""

    def __init__(self, cfg: RunConfig, shards: Shards, fam: Family, model_cfg: Any, episodes: tuple[int, ...], *,
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

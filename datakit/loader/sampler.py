"""One global sample order, split across ranks and steps, resumable at any step.

The order of an epoch is a pure function of (seed, epoch, number of anchors, shard of each
anchor): every rank computes the same permutation and takes its own slice of each global
batch, so ranks never overlap and never need to talk. Per-rank shuffles, the usual cause of
correlated loss spikes, cannot happen. The permutation comes from a splitmix64 hash sorted
with a stable argsort rather than numpy's Generator, whose streams may change between numpy
versions: a checkpoint taken under one numpy resumes bit-exactly under another.

Step s of epoch e, rank r reads order[(s * W + r) * B : (s * W + r + 1) * B]. DataLoader
workers receive whole rank batches, so they split the work without overlap by construction.

The position is world-size independent: after s steps the job has consumed the first s * W * B
samples of the epoch's order whatever W and B are. The state records that sample count, so a
job resumed with another world size or per-rank batch continues the same global order, as long
as the count falls on a whole step of the new split. The epoch's length (its tail dropped with
`drop_last`) is a whole number of `epoch_batch` samples: the trainer sets it to the optimiser's
global batch (micro-batch x ranks x accumulation), so how that batch is split into ranks and
micro-batches changes neither the epoch boundary nor the order.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixed hash of uint64 values."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _keys(seed: int, epoch: int, salt: int, ids: np.ndarray) -> np.ndarray:
    base = mix64(np.array([seed & (2**64 - 1)], np.uint64)) ^ mix64(np.array([(epoch << 8) | salt], np.uint64))
    return mix64(ids.astype(np.uint64) ^ base)


def block_ids(shards: np.ndarray, block_size: int) -> np.ndarray:
    """(M,) block of each anchor: runs of `block_size` consecutive anchors within one shard."""
    m = shards.shape[0]
    pos = np.arange(m, dtype=np.int64)
    new_shard = np.flatnonzero(np.diff(shards) != 0) + 1
    seg_start = np.zeros(m, np.int64)
    seg_start[new_shard] = new_shard
    seg_start = np.maximum.accumulate(seg_start)
    starts = ((pos - seg_start) % block_size) == 0
    return np.cumsum(starts) - 1


def epoch_order(n: int, *, seed: int, epoch: int, mode: str, blocks: np.ndarray | None = None) -> np.ndarray:
    """(n,) permutation of anchor positions for one epoch.

    "random": a full shuffle. "shard_block": blocks in a shuffled order, anchors shuffled
    inside their block, so a reader walks one contiguous byte range at a time.
    """
    ids = np.arange(n, dtype=np.int64)
    if mode == "sequential":
        return ids
    inner = _keys(seed, epoch, 1, ids)
    if mode == "random":
        return np.argsort(inner, kind="stable")
    if mode == "shard_block":
        if blocks is None:
            raise ValueError("shard_block order needs the block of each anchor")
        outer = _keys(seed, epoch, 2, blocks)
        return np.lexsort((inner, outer))
    raise ValueError(f"unknown shuffle mode {mode!r}")


@dataclass
class StepSampler:
    """Rank `rank`'s batches of anchor positions, step by step; `(epoch, step)` is its state.

    The state names the next step to deliver; the loader advances it only when a batch
    reaches the user, so prefetched batches do not count and a resume replays nothing.
    """

    num_anchors: int
    batch_size: int
    seed: int = 0
    mode: str = "random"
    rank: int = 0
    world_size: int = 1
    drop_last: bool = True
    blocks: np.ndarray | None = None
    epoch: int = 0
    step: int = 0
    # The epoch holds a whole number of these (0: the global batch); a multiple of the global batch.
    epoch_batch: int = 0

    def __post_init__(self) -> None:
        if self.num_anchors < self.global_batch:
            raise ValueError(
                f"{self.num_anchors} samples cannot fill one global batch of {self.global_batch} "
                f"({self.world_size} ranks x {self.batch_size})"
            )
        self.epoch_batch = self.epoch_batch or self.global_batch
        if self.epoch_batch % self.global_batch:
            raise ValueError(f"epoch_batch={self.epoch_batch} is not a multiple of the global batch "
                             f"{self.global_batch} ({self.world_size} ranks x {self.batch_size})")
        if self.num_anchors < self.epoch_batch:
            raise ValueError(f"{self.num_anchors} samples cannot fill one global batch of {self.epoch_batch} "
                             "(epoch_batch)")
        self._cached: tuple[int, np.ndarray] | None = None

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.num_anchors, self.epoch_batch)
        return (full + (1 if rest and not self.drop_last else 0)) * (self.epoch_batch // self.global_batch)

    def order(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            o = epoch_order(self.num_anchors, seed=self.seed, epoch=epoch, mode=self.mode, blocks=self.blocks)
            self._cached = (epoch, o)
        return self._cached[1]

    def batch(self, epoch: int, step: int, rank: int | None = None) -> np.ndarray:
        """Anchor positions of (epoch, step) for `rank`; a short last batch wraps to the start."""
        r = self.rank if rank is None else rank
        order = self.order(epoch)
        start = (step * self.world_size + r) * self.batch_size
        idx = np.arange(start, start + self.batch_size) % self.num_anchors
        return order[idx]

    def batches(self, epoch: int, start_step: int = 0) -> np.ndarray:
        """(steps, batch_size) anchor positions of the rank's batches from `start_step` to the
        end of the epoch, all at once: `batch(epoch, s)` for each s, vectorised."""
        steps = np.arange(start_step, self.steps_per_epoch, dtype=np.int64)
        start = (steps * self.world_size + self.rank) * self.batch_size
        return self.order(epoch)[(start[:, None] + np.arange(self.batch_size)) % self.num_anchors]

    def iter_epoch(self, epoch: int, start_step: int = 0) -> Iterator[list[int]]:
        """The rank's batches of one epoch from `start_step` on (pure; touches no state)."""
        for s in range(start_step, self.steps_per_epoch):
            yield self.batch(epoch, s).tolist()

    def advance(self) -> None:
        """Count one delivered batch; roll over to the next epoch at the end of this one."""
        self.step += 1
        if self.step >= self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        """The position, world-size independent: `sample` = samples of the epoch consumed.
        (`step` and `global_batch` are kept for readers of older states.)"""
        return {"epoch": self.epoch, "sample": self.step * self.global_batch, "step": self.step,
                "seed": self.seed, "num_anchors": self.num_anchors, "global_batch": self.global_batch,
                "epoch_batch": self.epoch_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at `state`'s position, with this sampler's ranks and batch size."""
        # states written before `sample`/`epoch_batch` existed: the epoch was whole global batches
        saved_global = int(state.get("global_batch", self.global_batch))
        saved = {"seed": state.get("seed", self.seed), "num_anchors": state.get("num_anchors", self.num_anchors),
                 "epoch_batch": state.get("epoch_batch", saved_global)}
        for key, value in saved.items():
            if value != getattr(self, key):
                raise ValueError(
                    f"checkpoint's sampler {key}={value} differs from this loader's "
                    f"{getattr(self, key)}: the resumed order would not match"
                )
        sample = int(state.get("sample", int(state["step"]) * saved_global))
        if sample % self.global_batch:
            raise ValueError(f"checkpoint's sampler stopped after {sample} samples of the epoch, not a whole "
                             f"step of this loader's global batch {self.global_batch} "
                             f"({self.world_size} ranks x {self.batch_size})")
        self.epoch, self.step = int(state["epoch"]), sample // self.global_batch

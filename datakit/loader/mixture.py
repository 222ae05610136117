"""Weighted mixtures of shard folders: the sources, and the seeded schedule that assigns each global
sample to one of them.

    ShardLoader({"droid/": 0.7, "libero/": 0.3}, cfg)
    ShardLoader([MixtureSource(root="droid/", weight=0.7, slots=("wrist", "ext1", None)),
                 MixtureSource(root="libero/", weight=0.3, slots=("wrist_image", "image", None),
                               prompt="pick up the bowl")], cfg)

The schedule: the global order is cut into blocks of `block` samples (the loader's `epoch_batch`,
the optimiser's global batch: world-size independent, so a resume on another world size sees the same
sources). Block g holds C_s(g + 1) - C_s(g) samples of source s, where C_s(n) is the largest-remainder
rounding of w_s * n * block (the cumulative counts sum to n * block exactly and each is within one of
its real quota), so over any window of whole blocks a source's count is within about one sample of its
weight's share; inside a block the sources' places are shuffled by the seed. A sample's index within
its source, k = C_s(g) + (its rank among the block's earlier samples of s), picks the source's own
order: epoch k // n_s, position k % n_s of that source's seeded permutation (`sampler.epoch_order`), so
a small source wraps and reshuffles while a large one goes on. Everything is a pure function of
(seed, weights, block, source sizes, global position): the loader's state stays one global position.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from datakit.loader.sampler import StepSampler, epoch_order, mix64

_SCHEDULE_SALT = 3  # the block shuffle's hash salt (the sampler uses 1 and 2)
CHUNK_SAMPLES = 4096  # SourceOrders computes the schedule of this many samples' blocks at once (at least one)


@dataclass(frozen=True, kw_only=True)
class MixtureSource:
    root: str  # shard folder path or URL
    weight: float  # > 0; the sources' weights are normalised to sum 1
    name: str = ""  # "" -> the folder's basename (unique in a mixture; a mapping's colliding ones: the paths)
    # This source's cameras filling the model's slots, in slot order (None: that slot empty for this
    # source); None -> the loader config's `slots` (as for one folder).
    slots: tuple[str | None, ...] | None = None
    prompt: str | None = None  # task text for every sample of the source (None: the dataset's own)
    # Sample only anchors of these episodes of this source (its episode_index; a trainer's per-source
    # validation holdout); None -> the loader config's `episodes` (as for one folder).
    episodes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", str(self.root))
        if not self.weight > 0 or self.weight == float("inf"):
            raise ValueError(f"mixture source {self.root}: weight must be a finite number > 0, got {self.weight}")
        if self.episodes is not None:
            object.__setattr__(self, "episodes", tuple(sorted({int(e) for e in self.episodes})))
            if not self.episodes:
                raise ValueError(f"mixture source {self.root}: episodes is empty; use None for every episode")
        if self.slots is not None:
            object.__setattr__(self, "slots", tuple(s or None for s in self.slots))
        if not self.name:
            object.__setattr__(self, "name", PurePosixPath(self.root.rstrip("/")).name or self.root)


def mixture_sources(root: str | Path | Mapping[str, float] | Sequence[MixtureSource]
                    ) -> tuple[MixtureSource, ...] | None:
    """The sources `ShardLoader(root, ...)` mixes; None for one folder (a str or Path)."""
    if isinstance(root, (str, Path)):
        return None
    if isinstance(root, Mapping):
        sources = tuple(MixtureSource(root=str(k), weight=float(v)) for k, v in root.items())
        if len({s.name for s in sources}) < len(sources):  # droid/out, libero/out: the paths name them
            sources = tuple(dataclasses.replace(s, name=s.root) for s in sources)
    else:
        sources = tuple(root)
        bad = [s for s in sources if not isinstance(s, MixtureSource)]
        if bad:
            raise ValueError(f"a mixture is a path -> weight mapping or a list of MixtureSource, got {bad[0]!r}")
    if not sources:
        raise ValueError("a mixture needs at least one source")
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"mixture sources share the name(s) {twice}; give each a distinct `name`")
    return sources


def normalised_weights(sources: Sequence[MixtureSource]) -> np.ndarray:
    """The weights as shares summing to 1; scaled by the largest first, so that weights whose sum
    overflows float64 (1e308 and 1e308) give their ratios, not inf / inf."""
    w = np.array([s.weight for s in sources], np.float64)
    w = w / w.max()
    return w / w.sum()


def cumulative_counts(weights: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(len(n), S) int64: C_s(n) = largest-remainder rounding of weights_s * n (rows sum to n)."""
    target = np.asarray(n, np.float64)[:, None] * weights[None, :]
    base = np.floor(target + 1e-9).astype(np.int64)
    short = np.asarray(n, np.int64) - base.sum(axis=1)
    # the `short` largest remainders get one more (ties: the lower source index)
    rank = np.argsort(np.argsort(-(target - base), axis=1, kind="stable"), axis=1, kind="stable")
    return base + (rank < short[:, None])


def block_schedule(weights: np.ndarray, block: int, seed: int, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(len(g), block) source and k of every sample of blocks `g`: its source, and how many earlier
    samples of the whole order that source has (C_s(g) + its rank among the block's earlier ones)."""
    g = np.asarray(g, np.int64)
    s = weights.size
    before = cumulative_counts(weights, g * block)
    counts = cumulative_counts(weights, (g + 1) * block) - before
    labels = np.repeat(np.tile(np.arange(s, dtype=np.int64), g.size), counts.reshape(-1)).reshape(g.size, block)
    # the block's places shuffled by the seed: splitmix64 keys of (seed, block, place), as the sampler's
    base = mix64(np.array([seed & (2**64 - 1)], np.uint64)) ^ mix64((g.astype(np.uint64) << np.uint64(8))
                                                                    | np.uint64(_SCHEDULE_SALT))
    keys = mix64(np.arange(block, dtype=np.uint64)[None, :] ^ base[:, None])
    labels = np.take_along_axis(labels, np.argsort(keys, axis=1, kind="stable"), axis=1)
    onehot = labels[:, :, None] == np.arange(s)[None, None, :]
    rank = np.take_along_axis(np.cumsum(onehot, axis=1, dtype=np.int32), labels[:, :, None], axis=2)[:, :, 0] - 1
    return labels, np.take_along_axis(before, labels, axis=1) + rank


def schedule(weights: np.ndarray, block: int, seed: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, k) per global position: its source, and how many earlier positions that source has."""
    positions = np.asarray(positions, np.int64)
    g, at = np.divmod(positions, block)
    blocks, row = np.unique(g, return_inverse=True)
    source, k = block_schedule(weights, block, seed, blocks)
    return source[row, at], k[row, at]


@dataclass
class SourceOrders:
    """Global positions -> (source, anchor position in that source): the schedule, then each source's
    own epochs of its own seeded order (`epoch_order` with its shuffle mode and shard blocks)."""

    weights: np.ndarray  # (S,) normalised
    block: int  # schedule block: the loader's epoch_batch
    seed: int
    sizes: tuple[int, ...]  # anchors per source
    mode: str  # the loader's shuffle mode
    blocks: tuple[np.ndarray | None, ...]  # per source: its anchors' shard blocks ("shard_block")

    def __post_init__(self) -> None:
        self._cache: dict[tuple[int, int], np.ndarray] = {}
        self.chunk = max(1, CHUNK_SAMPLES // self.block)  # blocks per schedule computation
        self._chunk: tuple[int, np.ndarray, np.ndarray] | None = None  # (first block, source, k) of those

    def schedule(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`schedule` of `positions`, from `chunk` blocks computed at once: one batch's numpy calls for
        many batches (per batch they cost ~1 ms, a tenth of a 480x640 batch's 8 ms read)."""
        g, at = np.divmod(positions, self.block)
        first = int(g.min()) // self.chunk * self.chunk
        if int(g.max()) >= first + self.chunk:  # a batch across two chunks
            return schedule(self.weights, self.block, self.seed, positions)
        if self._chunk is None or self._chunk[0] != first:
            self._chunk = (first, *block_schedule(self.weights, self.block, self.seed,
                                                  np.arange(first, first + self.chunk)))
        return self._chunk[1][g - first, at], self._chunk[2][g - first, at]

    def order(self, s: int, epoch: int) -> np.ndarray:
        key = (s, epoch)
        if key not in self._cache:
            if len(self._cache) > 2 * len(self.sizes):  # a source's current and next epoch each
                self._cache.clear()
            # each source its own seed: two sources of one size do not walk in step
            self._cache[key] = epoch_order(self.sizes[s], seed=self.seed * 1_000_003 + s, epoch=epoch,
                                           mode=self.mode, blocks=self.blocks[s])
        return self._cache[key]

    def __call__(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        source, k = self.schedule(np.asarray(positions, np.int64))
        local = np.empty_like(k)
        for s, n in enumerate(self.sizes):
            at = np.flatnonzero(source == s)
            if not at.size:
                continue
            epoch, j = np.divmod(k[at], n)
            first, last = int(epoch.min()), int(epoch.max())
            if first == last:  # the usual batch: one epoch of the source
                local[at] = self.order(s, first)[j]
                continue
            for e in range(first, last + 1):
                local[at[epoch == e]] = self.order(s, e)[j[epoch == e]]
        return source, local


class MixtureSampler(StepSampler):
    """`StepSampler` over a mixture's global positions: epoch e walks e * n .. (e + 1) * n - 1 in order
    (the schedule does the shuffling), split over ranks and steps, and resumed, exactly as one folder."""

    def order(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, np.arange(self.num_anchors, dtype=np.int64) + epoch * self.num_anchors)
        return self._cached[1]

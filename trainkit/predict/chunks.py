"""Open-loop action chunks over whole episodes: what the robot would have executed, frame by frame,
next to what was recorded.

A chunk is sampled every `every` frames of an episode (frames 0, every, 2 every, ...) from that
frame's observation, through the same loader preset, normaliser and batch adapter the run trained
with (the family's), and its first `every` actions are kept: the trajectory a policy executing
`every` actions per chunk (LeRobot's `n_action_steps`) would play, with no feedback. `every =
horizon` replays whole chunks back to back (GR00T's open-loop evaluation); `every = 1` keeps the
first action of a chunk at every frame. Predicted actions are unnormalised with the inverse of
the map the loader normalised with (`affine_from_stats`, the same float32 scale and bias), so the
errors are in the robot's units.

The flow noise of a sample is a function of (seed, its frame-table row) alone: the same actions
for any --batch-size, device order or episode subset.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from datakit.loader import Normaliser, ShardDataset
from datakit.loader.normalise import affine_from_stats
from datakit.shards.index import ShardIndex
from trainkit.config import DataConfig
from trainkit.data import Shards, loader_settings
from trainkit.errors import DataError, LaunchError
from trainkit.models import Family


@dataclass
class Prediction:
    """Every episode's trajectory, and how it was sampled."""

    episodes: list[Episode]
    horizon: int  # the model's action chunk length
    every: int  # a chunk every `every` frames
    seconds: float  # the sampling's wall time (reads, normalisation and the sampler)


@dataclass
class Episode:
    """One episode's open-loop trajectory, unnormalised, one row per frame."""

    episode_index: int
    predicted: np.ndarray  # (frames, action channels) float64
    recorded: np.ndarray  # (frames, action channels) float64, the dataset's actions


def parse_episodes(text: str, index: ShardIndex, where: str, flag: str = "--episodes") -> tuple[int, ...]:
    """Episode indices from "3,5,8-11" (ranges inclusive), each in the index of shard folder
    `where`; LaunchError for bad text, DataError naming the episodes the index lacks."""
    spans: list[tuple[int, int]] = []  # (first, last) inclusive: never expanded, a range may be huge
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, sep, hi = part.partition("-")
            first, last = int(lo), int(hi) if sep else int(lo)
            if first < 0 or last < first:
                raise ValueError
            spans.append((first, last))
    except ValueError:
        raise LaunchError(f"{flag}: a comma list of episode indices or ranges (3,5,8-11), got {text!r}") from None
    if not spans:
        raise LaunchError(f"{flag}: names no episode")
    have = {e.episode_index for e in index.episodes}
    chosen = {e for e in have if any(first <= e <= last for first, last in spans)}
    named = sum(last - first + 1 for first, last in _merged(spans))
    if named > len(chosen):
        missing = _first_missing(_merged(spans), have, 8)
        more = f" and {named - len(chosen) - len(missing)} more" if named - len(chosen) > len(missing) else ""
        raise DataError(where, f"{flag} names episodes {missing}{more}, which the shards lack (they have "
                        f"{len(have)}: {min(have)}..{max(have)})")
    return tuple(sorted(chosen))


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive spans sorted and merged where they overlap or touch."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _first_missing(spans: list[tuple[int, int]], have: set[int], n: int) -> list[int]:
    """The first `n` episodes of `spans` not in `have` (at most len(have) + n steps, whatever the spans)."""
    out: list[int] = []
    for first, last in spans:
        e = first
        while e <= last and len(out) < n:
            if e not in have:
                out.append(e)
            e += 1
    return out


def sample_noise(shapes: tuple[tuple[int, ...], ...], seed: int, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each noise tensor (B, *shape) of the samples of frame-table `rows`, N(0, 1) float32, drawn
    per sample from a generator keyed by (seed, row)."""
    per_sample = []
    for row in rows.tolist():
        g = torch.Generator().manual_seed(((seed * 1_000_003 + row) * 1_009 + 17) % (1 << 63))
        per_sample.append([torch.randn(shape, generator=g) for shape in shapes])
    return tuple(torch.stack(parts) for parts in zip(*per_sample))


def unnormalise(actions: torch.Tensor, stats: dict[str, list[float]], mode: str) -> torch.Tensor:
    """The inverse of the loader's action map y = x * scale + bias (datakit's `affine_from_stats`
    for data.norm `mode`): x = (y - bias) / scale, in float64."""
    scale, bias = affine_from_stats(stats, mode)
    return (actions.double() - bias.double()) / scale.double()


def predict_episodes(model: nn.Module, fam: Family, dcfg: DataConfig, shards: Shards, episodes: tuple[int, ...], *,
                     every: int | None, batch_size: int, seed: int, steps: int, device: torch.device,
                     dtype: torch.dtype = torch.float32) -> Prediction:
    """The open-loop trajectory of each episode (module docstring); `every` None: the horizon."""
    index = shards.index
    settings = loader_settings(dcfg, shards.slots, seed=0, rank=0, world_size=1, micro_batch=batch_size,
                               episodes=episodes, image_dtype=dtype, pin_memory=False)
    # the evaluation transform: a training crop at a random place (gr00t's model.random_crop) is the centre's here
    lcfg = replace(fam.loader_config(model.cfg, index, **settings), random_crop=False, crop_per_sample=False)
    every = lcfg.action_horizon if every is None else every
    if not 1 <= every <= lcfg.action_horizon:
        raise LaunchError(f"--every: must be 1..{lcfg.action_horizon} (the model's action horizon), got {every}")
    try:
        dataset = ShardDataset(dcfg.shards, lcfg, opened=(shards.folder, shards.cache, index))
    except ValueError as e:
        raise DataError(dcfg.shards, str(e)) from None
    normaliser = Normaliser.from_index(index, lcfg)
    adapter = fam.batches(model.cfg, index, normaliser)
    ep = dataset.ep_of_row[dataset.anchors]
    offset = dataset.anchors - dataset.episodes.row_start[ep]
    positions = np.flatnonzero(offset % every == 0)
    lengths = dict(zip(dataset.episodes.episode_index.tolist(), dataset.episodes.length.tolist()))
    n_actions = len(index.action_names)
    pred = {e: np.zeros((lengths[e], n_actions)) for e in episodes}
    rec = {e: np.zeros((lengths[e], n_actions)) for e in episodes}
    model.to(device=device, dtype=dtype)
    t0 = time.perf_counter()
    try:
        for start in range(0, positions.size, batch_size):
            hb = dataset.read_batch(positions[start:start + batch_size])
            batch = model_batch(adapter, normaliser, hb, seed=seed, device=device)
            noise = sample_noise(fam.sampler.noise_shapes(model.cfg), seed, hb["row"])
            with torch.no_grad():
                chunk = fam.sampler.sample(model, batch, tuple(n.to(device) for n in noise), steps).float()
            actions = unnormalise(chunk[..., :n_actions].cpu(), index.stats["action"], lcfg.norm).numpy()
            for i, (e, row) in enumerate(zip(hb["episode_index"].tolist(), hb["row"].tolist())):
                first = row - int(dataset.episodes.row_start[dataset.ep_of_row[row]])
                n = min(every, lengths[e] - first)
                pred[e][first:first + n] = actions[i, :n]
                rec[e][first:first + n] = hb["action"][i, :n].double().numpy()
    finally:
        dataset.files.close()
    return Prediction([Episode(e, pred[e], rec[e]) for e in episodes], lcfg.action_horizon, every,
                      time.perf_counter() - t0)


def model_batch(adapter: Any, normaliser: Normaliser, hb: dict[str, torch.Tensor], *, seed: int,
                device: torch.device) -> Any:
    """The family's batch of one host batch on `device`, as the run's float32 host path builds it:
    the family's extras (prompt tokens; the training noise and time it draws are not used), the
    loader's normalisation on the host, then the family's device batch."""
    hb = adapter.extras(hb, torch.Generator().manual_seed(seed))
    out = normaliser(hb)
    return adapter.model_batch({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in out.items()})

"""The loss per source of a mixture (`data.sources`): `loss/<name>` in metrics.jsonl's interval rows.

    per_source = SourceLoss(("droid", "libero"), device)
    per_source.add(items, batch.source)      # each micro-batch: (B,) per-item losses, (B,) source index
    per_source.end_step(applied)             # a skipped (non-finite) step's samples are not counted
    metrics.flush(per_source.reduce())       # at log steps, on every rank: {"loss/droid": ..., "samples/droid": ...}

A source's loss over a log interval is the mean of the per-item losses (each family's
`model(batch, per_item=True)`: the sample's own flow-matching MSE) of all its samples in the
interval's applied steps, on every rank and micro-batch: sums and counts per source are kept on the
device (no host sync per step) and all-reduced once per log step, where the metrics synchronise
anyway. `samples/<name>` is the source's count of those samples (the mixture's realised share); a
source without a sample in the interval has no loss key in that row. With equal-sized items
(pi05, dreamzero) the mean over all sources is the step loss's mean; GR00T's step loss normalises by
the action mask of the whole batch, its per-item losses each by their own.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

SOURCE_PREFIX = "loss/"  # an interval row's key of a source's loss: loss/<source name>
SAMPLES_PREFIX = "samples/"  # and of its sample count in the interval (all ranks): the mixture's realised share


class SourceLoss:
    """Per-source sums and counts of per-item losses on the device; reduced over ranks by `reduce`."""

    def __init__(self, names: tuple[str, ...], device: torch.device):
        self.names = names
        # row 0: the interval's loss sums, row 1: its sample counts (one all-reduce for both);
        # float64: a sum over many steps and samples keeps the per-item precision
        self._interval = torch.zeros(2, len(names), dtype=torch.float64, device=device)
        self._step = torch.zeros_like(self._interval)

    def add(self, items: torch.Tensor, source: torch.Tensor) -> None:
        """One micro-batch: `items` (B,) per-item losses, `source` (B,) int64 source indexes
        (StepBatch.sources: all 0 for a batch without them)."""
        source = source.to(self._step.device, non_blocking=True)
        self._step[0].index_add_(0, source, items.detach().to(torch.float64))
        self._step[1].index_add_(0, source, torch.ones_like(items, dtype=torch.float64))

    def end_step(self, applied: bool) -> None:
        """The step's samples count when it was applied (a skipped step's losses are NaN or inf)."""
        if applied:
            self._interval += self._step
        self._step.zero_()

    def reduce(self) -> dict[str, float]:
        """{"loss/<name>": mean} of the interval over every rank, then a new interval. A collective:
        every rank calls it at the same step."""
        total = self._interval.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        self._interval.zero_()
        sums, counts = total.tolist()
        return {**{f"{SOURCE_PREFIX}{name}": s / n for name, s, n in zip(self.names, sums, counts) if n > 0},
                **{f"{SAMPLES_PREFIX}{name}": int(n) for name, n in zip(self.names, counts)}}

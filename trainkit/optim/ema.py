"""An exponential moving average of the trainable weights (`train.ema_decay`), for evaluation.

    ema = WeightEMA(model, decay=0.999)      # after init: the average starts at the initial weights
    opt.step(); ema.update()                 # after every applied optimiser step
    with ema.swapped_in():                   # the model computes with the averaged weights
        val = validation.loss(model)
    state["ema"] = ema.state_dict()          # DCP: saved and resharded with the checkpoint

The average is kept where the optimiser keeps the master weights: on each parameter's sharded
fp32 storage (an FSDP2 DTensor's local shard, or the plain tensor without FSDP), one
`_foreach_lerp_` per step, ema += (1 - d)(w - ema), so it costs one fp32 copy of this rank's shard
and no communication (at Pi0.5 `full` on one GPU: 13.4 GB, and by an estimate, not a measurement,
about 10 ms a step: three passes over 13.4 GB of HBM at ~4 TB/s). openpi's JAX trainer keeps one
(decay 0.99); its absence in the PyTorch ports is a suspect for their quality gap (openpi #989). Frozen parameters never change and are not averaged.
`swapped_in` exchanges the weights one parameter at a time, so it needs one parameter's worth of
extra memory, not a second model.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from trainkit.parallel.names import clean_name


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class WeightEMA:
    """The average of `model`'s trainable parameters, updated in place after each step."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        named = [(clean_name(n), p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        with torch.no_grad():
            self.shadow = [p.detach().clone() for p in self.params]  # DTensors stay sharded like their parameter

    @torch.no_grad()
    def update(self, skip: torch.Tensor | None = None) -> None:
        """ema <- decay x ema + (1 - decay) x weights; `skip` (a 0-dim device flag, the deferred
        non-finite check's): 1 leaves the average unchanged, without a host sync."""
        shadow, params = [_local(s) for s in self.shadow], [_local(p) for p in self.params]
        if skip is None:
            torch._foreach_lerp_(shadow, params, 1.0 - self.decay)
            return
        weight = (1.0 - skip) * (1.0 - self.decay)
        for s, p in zip(shadow, params):
            s.lerp_(p, weight)

    @torch.no_grad()
    def reset(self) -> None:
        """Restart the average at the current weights (a resume from a checkpoint that had none)."""
        for s, p in zip(self.shadow, self.params):
            _local(s).copy_(_local(p))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """name -> averaged tensor (the live storage: DCP loads a checkpoint's values into it)."""
        return dict(zip(self.names, self.shadow))

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in the model for the block, the trained ones back after it."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def _swap(self) -> None:
        for s, p in zip(self.shadow, self.params):
            a, b = _local(s), _local(p)
            tmp = b.clone()
            b.copy_(a)
            a.copy_(tmp)

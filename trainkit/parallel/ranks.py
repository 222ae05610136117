"""The few collectives trainkit's bookkeeping needs (checkpoint files, the run lock, the NaN
decision), written so that they also work in one process without a process group.

Every decision that could end a run (a checkpoint is damaged, output.dir is taken, a step is
non-finite) is taken once and shared, so all ranks raise together instead of some waiting
forever in the next collective.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist


def rank_world() -> tuple[int, int]:
    """(rank, world size) of the process group; (0, 1) without one."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (a small picklable value of our own, never read from disk)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out

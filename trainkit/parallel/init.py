"""The initial weights of a parallelized model: those of one process, at any world size.

    plan = parallelize(model, cfg.parallel, world_size); model.to_empty(device=device)
    torch.manual_seed(cfg.train.seed); init_weights(model)      # instead of model.init_weights()

A family draws its weights in `model.init_weights()` from the global torch RNG, after parallelize()
made the parameters FSDP2's sharded DTensors. On CUDA, DTensor's RNG tracker draws each shard at
its own offset of the random stream. A CPU mesh has no tracker: torch warns "DTensor random
operators may not have complete support on cpu device mesh" on every CPU run, and each rank draws
its shard from the start of the same stream, so at world size 2 the two halves of every matrix were
copies of each other and a 2-process CPU run started from other weights than a 1-process one.

On a CPU mesh, then, whole plain tensors stand in for the DTensors during the call, and each rank
keeps its own shard of them (`distribute_tensor` with every rank holding the same whole tensor, so
nothing is sent): one process's draws in one process's order, so the same weights at every world
size, and no warning. The cost is one whole copy of the model per rank during the call; CPU runs
train tiny models.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor


@torch.no_grad()
def init_weights(model: nn.Module) -> None:
    """`model.init_weights()`, giving sharded parameters on a CPU mesh the weights of one process."""
    slots = [(module, name, p) for module in model.modules() for name, p in module._parameters.items()
             if isinstance(p, DTensor) and p.device_mesh.device_type == "cpu"]
    if not slots:
        model.init_weights()  # no DTensor, or a mesh with DTensor's RNG tracker (CUDA)
        return
    whole: dict[int, nn.Parameter] = {}  # one stand-in per parameter, shared where a parameter is (tied weights)
    for module, name, p in slots:
        module._parameters[name] = whole.setdefault(
            id(p), nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device), p.requires_grad))
    try:
        model.init_weights()
        for p in {id(p): p for _, _, p in slots}.values():
            mine = distribute_tensor(whole[id(p)].detach(), p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(mine.to_local())
    finally:
        for module, name, p in slots:
            module._parameters[name] = p

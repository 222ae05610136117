"""torch.compile per block: each block of each block list is compiled in place.

Per block rather than the whole model (torchtitan's `apply_compile`): the blocks of a list are
identical, so Dynamo traces one graph per list and reuses it (parameters are graph inputs),
compile time stays at seconds per block type, and FSDP's hooks between blocks stay outside
the graphs. Batches whose number of image slots differs (pruning) get their own graph; the
recompile limit is raised so that a handful of slot counts never falls back to eager.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def apply_compile(model: nn.Module, block_lists: tuple[str, ...]) -> int:
    """Compile every block of `block_lists` in place; returns the number of blocks compiled. (CUDA
    graphs are not the compiler's "reduce-overhead" mode: cudagraphs.py captures the whole micro-step.)"""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    n = 0
    for name in block_lists:
        for block in getattr(model, name):
            block.compile()
            n += 1
    return n

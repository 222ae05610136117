"""torch.compile per block: each block of each block list is compiled in place.

Per block rather than the whole model (torchtitan's `apply_compile`): the blocks of a list are
identical, so Dynamo traces one graph per list and reuses it (parameters are graph inputs),
compile time stays at seconds per block type, and FSDP's hooks between blocks stay outside
the graphs. Batches whose number of image slots differs (pruning) get their own graph; the
recompile limit is raised so that a handful of slot counts never falls back to eager.

`parallel.inductor` sets torch._inductor.config values for the process before anything compiles
(e.g. `max_pointwise_cat_inputs`: how many inputs a concatenation may have and still be fused as
one pointwise kernel that loads every input per output element, rather than each input written
into its slice of the output; Pi0.5's GeGLU backward concatenates the two halves' gradients).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from trainkit.errors import ConfigError


def apply_inductor_config(settings: dict[str, Any]) -> None:
    """Set each `parallel.inductor` name on torch._inductor.config; ConfigError for an unknown name
    or a value of another type than the setting's."""
    import torch._inductor.config as inductor

    for name, value in settings.items():
        if not hasattr(inductor, name):
            raise ConfigError(f"parallel.inductor.{name}", f"torch {torch.__version__} has no "
                              f"torch._inductor.config.{name}")
        current = getattr(inductor, name)
        if current is not None and type(current) is not type(value) and not (
                isinstance(current, float) and type(value) is int):
            raise ConfigError(f"parallel.inductor.{name}", f"expected {type(current).__name__} "
                              f"(torch._inductor.config.{name} = {current!r}), got {value!r}")
        setattr(inductor, name, value)


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

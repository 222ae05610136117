"""CUDA graphs: where they apply, and an honest refusal where they do not.

A CUDA graph replays kernels with the device addresses captured once. That fits a model whose
parameters stay put: `fsdp = "none"` (one GPU, or small models), where compiling each block with
mode "reduce-overhead" captures it (cudagraph trees) and removes the launch gaps between its
small kernels. With FSDP2 it does not apply per block: every unit's parameters are all-gathered
into storage that is freed after use and re-filled for the next step, the all-gathers and
reduce-scatters run from Python hooks between blocks, and a graph captured around one block
would replay stale parameter addresses. At Pi0.5's full shapes a step launches mostly large
matmuls, so the launch gaps graphs would remove are a small part of a step (the profile
summary in bench/results/trainkit.md measures them).
"""
from __future__ import annotations

from trainkit.errors import ConfigError


def cuda_graph_mode(enabled: bool, fsdp: str) -> str | None:
    """The torch.compile mode for blocks: "reduce-overhead" (graphs) or None; refuses FSDP."""
    if not enabled:
        return None
    if fsdp != "none":
        raise ConfigError("parallel.cuda_graphs", f"needs parallel.fsdp = 'none' (got {fsdp!r}): FSDP2 frees "
                          "and re-gathers parameter storage around every unit, which a captured graph cannot follow")
    return "reduce-overhead"

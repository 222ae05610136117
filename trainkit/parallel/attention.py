"""The joint attention without a dense mask: `parallel.attention = "varlen"`.

Every block that exposes a `joint_attention` function (pi05's MoT layers) gets the mask-free
`varlen_prefix_suffix_attention` instead of the key-padding-masked SDPA: the same function (tests
compare both with a dense mask built by hand, padding included), with the valid keys packed and
a variable-length kernel. Applied first in parallelize(), before recompute and compile wrap the
blocks, so the compiled graphs trace the new function.
"""
from __future__ import annotations

import torch.nn as nn

from trainkit.errors import ConfigError
from trainkit.models.layers import prefix_suffix_attention
from trainkit.models.varlen_attention import varlen_prefix_suffix_attention

ATTENTION = {"masked": prefix_suffix_attention, "varlen": varlen_prefix_suffix_attention}


def apply_attention(model: nn.Module, kind: str) -> int:
    """Set every block's joint attention to `kind`; returns the number of blocks changed."""
    blocks = [m for m in model.modules() if hasattr(m, "joint_attention")]
    if kind != "masked" and not blocks:
        raise ConfigError("parallel.attention", f"{kind!r} needs a model with a joint attention (pi05); this one has none")
    for block in blocks:
        block.joint_attention = ATTENTION[kind]
    return len(blocks)

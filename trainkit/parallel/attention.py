"""The joint attention without a dense mask: `parallel.attention = "varlen"`.

Every block that exposes a `joint_attention` function (pi05's MoT layers) gets the mask-free
`varlen_prefix_suffix_attention` instead of the key-padding-masked SDPA: the same function (tests
compare both with a dense mask built by hand, padding included), with the valid keys packed and
a variable-length kernel. Applied first in parallelize(), before recompute and compile wrap the
blocks, so the compiled graphs trace the new function.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from trainkit.errors import ConfigError
from trainkit.models import varlen_attention
from trainkit.models.layers import prefix_suffix_attention
from trainkit.models.varlen_attention import varlen_prefix_suffix_attention

ATTENTION = {"masked": prefix_suffix_attention, "varlen": varlen_prefix_suffix_attention}


def apply_attention(model: nn.Module, kind: str, param_dtype: str = "bfloat16") -> int:
    """Set every block's joint attention to `kind`; returns the number of blocks changed. On CUDA,
    "varlen" runs FlashAttention-2, which takes bf16/fp16 only and exists from torch 2.9."""
    blocks = [m for m in model.modules() if hasattr(m, "joint_attention")]
    if kind != "masked" and not blocks:
        raise ConfigError("parallel.attention", f"{kind!r} needs a model with a joint attention (a block with "
                          "`joint_attention`, trainkit/models/family.py); this one has none")
    if kind == "varlen" and torch.cuda.is_available():
        if varlen_attention.varlen_attn is None:
            raise ConfigError("parallel.attention", f"'varlen' needs torch >= 2.9 (torch.nn.attention.varlen); "
                              f"this is {torch.__version__}")
        if param_dtype != "bfloat16":
            raise ConfigError("parallel.attention", f"'varlen' runs FlashAttention on CUDA, which needs "
                              f"parallel.param_dtype = 'bfloat16' (got {param_dtype!r})")
    for block in blocks:
        block.joint_attention = ATTENTION[kind]
    return len(blocks)

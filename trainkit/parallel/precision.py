"""Mixed precision: bf16 parameters for compute, fp32 master weights and fp32 gradient reduction.

With FSDP2 the policy is handed to every `fully_shard` call: the sharded fp32 parameters are
cast to `param_dtype` as they are all-gathered, and gradients are reduce-scattered in
`reduce_dtype` (fp32 reduction avoids bf16 rounding of the sum over ranks). Without FSDP the
same dtype is applied by autocast around the forward.
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def mp_policy(param_dtype: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    """The FSDP2 mixed-precision policy for the configured dtypes."""
    return MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[reduce_dtype])


def autocast(param_dtype: str, device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """Autocast to `param_dtype` for a model that FSDP does not cast (fsdp = "none")."""
    if not enabled or param_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_DTYPES[param_dtype])

"""FP8 GEMMs for the large linears: torchao's rowwise-scaled float8 training (`parallel.float8_modules`).

    float8_modules = ["lm_layers.*.lm.mlp.*"]   # Gemma-2B's GeGLU: gate_up 2048 -> 32768, down 16384 -> 2048

Each matching `nn.Linear` becomes torchao's `Float8Linear`, by default with the "rowwise" recipe
(`parallel.float8_recipe`; "rowwise_with_gw_hp" keeps the weight-gradient GEMM in bf16 and so
skips the column-wise casts, "tensorwise" scales whole tensors: cheaper casts, coarser): inputs,
weights and output gradients are cast to e4m3 with one scale per row (per column for the weight
gradient's operands), the three GEMMs of forward + backward run through `torch._scaled_mm`, and
the weights stay in the configured precision (fp32 master, bf16 compute through FSDP). The casts
are elementwise work that torch.compile fuses into the neighbouring kernels, so FP8 is only worth
it on GEMMs large enough to hide them: published results (torchao, torchtitan) show linears with
small K or N losing. The optimised config takes only Gemma-2B's GeGLU (K and N >= 2048, 75% of the
step's GEMM time in the profile of bench/results/pi05_h200.md); bench/kernels/bench_kernels_gpu.py times
FP8 against bf16 per linear family to confirm or widen that (not yet run on a GPU). FP8 counts
the same FLOPs as bf16 for MFU.

`torch._scaled_mm` wants every contracted dimension a multiple of 16, and the weight gradient
contracts over the micro-batch's tokens: Pi0.5's prefix has 712 or 968 tokens (8 mod 16), so its
FP8 micro-batches must be even (an odd one fails in the first backward, naming _scaled_mm).

torchao is an optional dependency (`pip install 'robodata[float8]'`); FP8 GEMMs need a CUDA GPU
with FP8 tensor cores (compute capability 8.9+: L40, H100/H200, B200), so a CPU run is refused.
Applied first in parallelize() (on the meta model, as torchtitan's converters): recompute,
compile and FSDP then wrap the converted modules.
"""
from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn as nn

from trainkit.errors import ConfigError

KEY = "parallel.float8_modules"


def float8_targets(model: nn.Module, patterns: list[str]) -> list[str]:
    """Qualified names of the nn.Linear modules matched by any `patterns` (fnmatch, dotted)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and any(fnmatchcase(name, p) for p in patterns)]


def check_float8_device() -> None:
    """ConfigError unless this process will train on a CUDA GPU with FP8 tensor cores."""
    if not torch.cuda.is_available():
        raise ConfigError(KEY, "FP8 GEMMs need a CUDA GPU with FP8 tensor cores (compute capability 8.9+: "
                          "L40, H100/H200, B200); this run is on the CPU. Set parallel.float8_modules = [] there")
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        raise ConfigError(KEY, f"FP8 GEMMs need compute capability 8.9+ (L40, H100/H200, B200); "
                          f"{torch.cuda.get_device_name()} is {cap[0]}.{cap[1]}")


def apply_float8(model: nn.Module, patterns: list[str], recipe: str = "rowwise") -> list[str]:
    """Convert the matched linears to float8 training (torchao's `recipe`: rowwise,
    rowwise_with_gw_hp, tensorwise) in place; returns their names."""
    check_float8_device()
    names = float8_targets(model, patterns)
    if not names:
        raise ConfigError(KEY, f"{patterns} matches no nn.Linear of the model")
    bad = [n for n in names if any(d % 16 for d in model.get_submodule(n).weight.shape)]
    if bad:
        raise ConfigError(KEY, f"{bad[0]}: FP8 GEMMs need both weight dimensions divisible by 16")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise ConfigError(KEY, "needs torchao (pip install 'robodata[float8]', torchao >= 0.17 for torch 2.11)") from None
    wanted = set(names)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda _m, fqn: fqn in wanted)
    return names

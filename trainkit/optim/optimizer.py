"""AdamW, fused or not, and the learning-rate schedule (linear warm-up, then cosine or flat);
on resume, `apply_config` puts the config's settings on the restored optimiser (trainkit/checkpoint/resume_rules.py).

Fused AdamW updates every parameter in one multi-tensor kernel instead of a few kernels per
parameter: at 3.24B parameters in hundreds of tensors that is a visible share of a step.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from trainkit.config import OptimConfig


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; `fused` only where the device supports it."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = cfg.fused and device.type in ("cuda", "cpu")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, fused=fused or None)


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """lr x factor(step): linear warm-up over `warmup_steps`, then cosine to `min_lr_ratio` or flat."""
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        done = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def apply_config(opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR, cfg: OptimConfig) -> None:
    """After a resume: the optimiser's hyperparameters from `cfg`, and its lr from `cfg.lr` and the
    restored schedule position (a restored LambdaLR would keep the checkpoint's base lr). With an
    unchanged config this computes the very value the checkpointed scheduler had set."""
    sched.base_lrs = [cfg.lr] * len(opt.param_groups)
    for group, factor in zip(opt.param_groups, sched.lr_lambdas):
        group.update(lr=cfg.lr * factor(sched.last_epoch), initial_lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                     weight_decay=cfg.weight_decay)

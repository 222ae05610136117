"""The sections of the one training config: a `@dataclass(kw_only=True)` each, a comment per field
and checks in `__post_init__` (datakit's `LoaderConfig` is the model), gathered by `RunConfig`.

The `[data]` section and a mixture's sources are in data.py, the field checks every section runs in
checks.py; reading a TOML file, `--set` overrides and overlays into this tree is load.py.
Required keys (they have no sensible default): `REQUIRED`. `config_from_dict` builds the tree from a
raw dict strictly: an unknown key or a value of the wrong type is a `ConfigError` naming the dotted key.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from trainkit.config.checks import check_choices, check_finite
from trainkit.config.data import DataConfig
from trainkit.errors import ConfigError


def _default_family() -> str:
    from trainkit.models import DEFAULT_FAMILY  # when a config names none: the model is built from it anyway
    return DEFAULT_FAMILY


REQUIRED = ("data.shards", "train.steps", "train.seed", "output.dir", "model.preset")
Dtype = Literal["bfloat16", "float32"]


@dataclass(kw_only=True)
class ModelConfig:
    # a family of the registry, trainkit.models.FAMILIES; default: its first (models.DEFAULT_FAMILY)
    family: str = field(default_factory=_default_family)
    preset: str = ""  # a preset of that family (pi05: "tiny", "tiny_deep", "full")
    # A folder with model.safetensors + config.json (LeRobot's save_pretrained, lerobot/pi05_base,
    # openpi's PyTorch converter) to start from instead of random weights; "": random init. A resume
    # reloads the run's own checkpoint instead (trainkit/weights/load.py).
    init_from: str = ""
    # Every other model.* key is a field of the family's config, replaced on top of the preset
    # (`model.lm_depth = 4`); checked against that config when the model is built.
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 0  # optimiser steps of the whole run (a resumed run stops at the same step)
    seed: int = 0  # one seed for init, sample order and flow noise, the same on every rank
    # samples per GPU per forward/backward, or "auto": the largest that splits global_batch evenly
    # whose memory estimate fits the GPU less memory_headroom (trainkit/estimate/auto_batch.py)
    micro_batch: int | str = 8
    # Samples per optimiser step over all ranks; 0 = micro_batch x world size. Must be a
    # multiple of micro_batch x world size (the rest is gradient accumulation).
    global_batch: int = 0
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping (the norm is still logged)
    memory_cap_gib: float = 0.0  # refuse to start when inspect's per-GPU estimate exceeds it; 0 = off
    # the fraction of the GPU's memory micro_batch = "auto" leaves beyond the estimate (its error,
    # the CUDA context, the allocator's reserve: trainkit/estimate/auto_batch.py says why 10%)
    memory_headroom: float = 0.10
    # A step whose loss or gradient norm is NaN/inf: "stop" the run with one line naming the step
    # and its rows; "skip" leaves the step out (no update) and counts it (trainkit/optim/nonfinite.py).
    on_nonfinite: Literal["stop", "skip"] = "stop"
    # When the host reads that check: "sync" waits for each step's verdict before the optimiser step
    # (one host sync a step, the GPU idle meanwhile); "deferred" skips a non-finite update on the
    # device (fused AdamW's found_inf: needs optim.fused) and reads the verdict one step later.
    nonfinite_check: Literal["sync", "deferred"] = "sync"
    # EMA of the trainable weights, ema = d x ema + (1 - d) x w after every applied step, on the
    # sharded fp32 parameters and in the checkpoint (trainkit/optim/ema.py); 0 = off.
    ema_decay: float = 0.0
    # With a holdout (data.val_*): the validation loss every eval_every steps and after the last
    # (0: after the last only), over eval_batches micro-batches per rank (trainkit/validation.py).
    eval_every: int = 0
    eval_batches: int = 4

    def __post_init__(self) -> None:
        check_choices(self, "train")
        check_finite("train.ema_decay", self.ema_decay, low=0.0, high=1.0, what="a number in [0, 1) (0: off)")
        if self.ema_decay == 1.0:
            raise ConfigError("train.ema_decay", "must be < 1 (1 would never move the average)")
        if self.eval_every < 0:
            raise ConfigError("train.eval_every", f"must be >= 0 (0: after the last step only), got {self.eval_every}")
        if self.eval_batches < 1:
            raise ConfigError("train.eval_batches", f"must be >= 1, got {self.eval_batches}")
        if self.steps < 1:
            raise ConfigError("train.steps", f"must be >= 1, got {self.steps}")
        if isinstance(self.micro_batch, str) and self.micro_batch != "auto" or \
                isinstance(self.micro_batch, int) and self.micro_batch < 1:
            raise ConfigError("train.micro_batch", f"must be >= 1 or \"auto\", got {self.micro_batch!r}")
        check_finite("train.memory_headroom", self.memory_headroom, low=0.0, high=1.0, what="a fraction in [0, 1)")
        if self.memory_headroom == 1.0:
            raise ConfigError("train.memory_headroom", "must be < 1 (1 leaves no memory to train in)")
        if self.global_batch < 0:
            raise ConfigError("train.global_batch",
                              f"must be >= 0 (0: micro_batch x world size), got {self.global_batch}")
        check_finite("train.grad_clip", self.grad_clip, low=0.0, what="a finite number >= 0 (0: no clipping)")
        check_finite("train.memory_cap_gib", self.memory_cap_gib, low=0.0, what="a finite number >= 0 (0: off)")


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    fused: bool = False  # fused AdamW kernel (one launch for all parameters)
    # train.grad_clip applied inside fused AdamW (its grad_scale: the kernel divides each gradient
    # by max(1, norm / grad_clip) as it reads it) instead of a separate pass that rescales every
    # gradient in place (GR00T N1.7 at micro-batch 16: ~3.8 ms of an 88 ms step on one H100);
    # needs fused. The same update up to rounding (x / s for x * (1 / s)): trainkit/optim/clip.py
    clip_in_step: bool = False
    warmup_steps: int = 0  # linear warm-up from 0
    schedule: Literal["cosine", "constant"] = "cosine"  # after warm-up: cosine down to min_lr_ratio x lr, or flat
    min_lr_ratio: float = 0.1  # in [0, 1]: the cosine's floor as a fraction of lr

    def __post_init__(self) -> None:
        check_choices(self, "optim")
        # a NaN or negative value here trains on without an error: NaN weights, or gradient ascent
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError("optim.lr", f"must be a finite number > 0, got {self.lr}")
        check_finite("optim.weight_decay", self.weight_decay, low=0.0, what="a finite number >= 0")
        if len(self.betas) != 2 or not all(math.isfinite(b) and 0 <= b < 1 for b in self.betas):
            raise ConfigError("optim.betas", f"needs 2 values in [0, 1), got {self.betas}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ConfigError("optim.eps", f"must be a finite number > 0, got {self.eps}")
        if self.warmup_steps < 0:
            raise ConfigError("optim.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        check_finite("optim.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0, what="a number in [0, 1]")


@dataclass(kw_only=True)
class ParallelConfig:
    # FSDP2 wrapping: "none" (plain module, one process or replicated), "root" (one unit for the
    # whole model: one all-gather of everything), "block" (one unit per group of blocks + root).
    fsdp: Literal["none", "root", "block"] = "block"
    group: dict[str, int] = field(default_factory=dict)  # block list -> blocks per FSDP unit (default 1)
    prefetch: bool = True  # explicit forward/backward prefetch of the next unit's all-gather
    # Free a block unit's gathered parameters after its forward (and all-gather them again in
    # backward). False keeps them to backward: half the all-gathers, + the unsharded bf16 blocks in memory.
    reshard_after_forward: bool = True
    ac_stride: dict[str, int] = field(default_factory=dict)  # block list -> recompute every n-th block (0 off)
    compile: bool = False  # torch.compile each block
    # CUDA graphs: forward + backward of each micro-batch captured once per batch shape and
    # replayed, FSDP2 included (parallel/cudagraphs.py); CUDA only
    cuda_graphs: bool = False
    # Where a graph without gradient accumulation puts the gradients: "zeroed" tensors allocated
    # before the capture, zeroed after each step and added into; "owned": tensors of the graph's
    # own pool it overwrites (no zeroing, no adds; the same losses: parallel/cudagraphs.py);
    # "owned_first": also with accumulation, a step's first micro-batch writing them and the others
    # adding (FirstWritesStep). Without FSDP only (one rank with fsdp_one_rank = false); under FSDP
    # the graph keeps "zeroed"
    graph_grads: Literal["zeroed", "owned", "owned_first"] = "zeroed"
    # Frozen parameters: "shard" them with FSDP like the rest (gathered every step), or
    # "replicate" them in param_dtype on every rank, out of FSDP (parallel/frozen.py)
    frozen: Literal["shard", "replicate"] = "shard"
    # False: one rank trains without FSDP (a plain module under autocast): FSDP2 shards nothing
    # there but still copies every parameter in and every gradient out each step (GR00T N1.6 at
    # micro-batch 16 on one H200: ~22 ms of a 96 ms step). More ranks always use `fsdp`.
    fsdp_one_rank: bool = True
    # The joint attention of MoT layers: "masked" (SDPA with a key-padding mask) or "varlen" (the
    # same function with the valid keys packed and a variable-length kernel, no mask: parallel/attention.py)
    attention: Literal["masked", "varlen"] = "masked"
    # fnmatch patterns of nn.Linear names trained with rowwise FP8 GEMMs (torchao; CUDA sm89+ only;
    # parallel/float8.py); [] = every linear in param_dtype
    float8_modules: list[str] = field(default_factory=list)
    # torchao's scaling recipe for them: "rowwise" (a scale per row: the most accurate),
    # "rowwise_with_gw_hp" (the weight-gradient GEMM in bf16, so no column-wise casts),
    # "tensorwise" (one scale per tensor: the cheapest casts)
    float8_recipe: Literal["rowwise", "rowwise_with_gw_hp", "tensorwise"] = "rowwise"
    param_dtype: Dtype = "bfloat16"  # compute dtype of parameters (FSDP mixed precision / autocast)
    reduce_dtype: Dtype = "float32"  # dtype of gradient reduce-scatter
    expandable_segments: bool = True  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    # torch._inductor.config settings for the compiled blocks, e.g. {max_pointwise_cat_inputs = 1}
    # (names checked against the installed torch when compile applies them: parallel/compile.py;
    # without parallel.compile they change nothing)
    inductor: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choices(self, "parallel")
        for name, d in (("group", self.group), ("ac_stride", self.ac_stride)):
            for k, v in d.items():
                if v < (1 if name == "group" else 0):
                    raise ConfigError(f"parallel.{name}.{k}", f"must be >= {1 if name == 'group' else 0}, got {v}")
        for k, v in self.inductor.items():
            if not isinstance(v, (bool, int, float, str)):
                raise ConfigError(f"parallel.inductor.{k}", f"must be a boolean, number or string, got {v!r}")


@dataclass(kw_only=True)
class OutputConfig:
    dir: str = ""  # metrics.jsonl, checkpoints/ and profile files go here
    log_every: int = 10  # steps between metric lines (each one synchronises the GPU once)
    checkpoint_every: int = 0  # steps between checkpoints; 0: none on the way (see save_last)
    # A checkpoint of the last step (train.steps reached, or a SIGTERM's step) when none was written
    # for it, so every run leaves one to export or extend (LeRobot saves "after the last training
    # step" too); false: only the every-N ones (`trainkit tune`/`ladder` and bench trials set it).
    save_last: bool = True
    keep_checkpoints: int = 3  # the newest N checkpoints are kept, older ones deleted; 0 = keep all
    resume: bool = True  # continue from the newest intact checkpoint in dir, if any (trainkit/checkpoint/dcp.py)
    progress: bool = True  # a progress bar on rank 0, when stderr is a terminal (a log gets the step lines alone)
    # Rank 0 also sends the metrics.jsonl rows to TensorBoard (<dir>/tensorboard/) or wandb (<dir>/wandb/,
    # offline unless WANDB_MODE is set); each needs its extra: pip install '.[tensorboard]' (trainkit/observe/trackers.py)
    tracker: Literal["none", "tensorboard", "wandb"] = "none"
    profile_steps: int = 0  # > 0: torch.profiler over this many steps after warm-up, summary written
    # Debug: every rank appends the frame-table rows of each micro-batch it trained on to
    # samples-rank{R}.jsonl (trainkit/observe/sample_log.py); checks rank disjointness and resume order.
    record_samples: bool = False

    def __post_init__(self) -> None:
        check_choices(self, "output")
        if self.log_every < 1:
            raise ConfigError("output.log_every", f"must be >= 1, got {self.log_every}")
        for key in ("checkpoint_every", "keep_checkpoints", "profile_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"output.{key}", f"must be >= 0 (0: off), got {getattr(self, key)}")


@dataclass(kw_only=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    """The config of `RunConfig.to_dict()` output (a checkpoint's trainkit.json), checked as a file's."""
    return build(RunConfig, raw, "")


def build(cls: Any, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(prefix.rstrip("."), f"must be a table, got {raw!r}")
    hints, kw = field_types(cls), {}
    if cls is ModelConfig:  # keys other than its own are the family config's fields
        raw = {**{k: v for k, v in raw.items() if k in hints},
               "overrides": {**raw.get("overrides", {}), **{k: v for k, v in raw.items() if k not in hints}}}
    for name, value in raw.items():
        if name not in hints:
            raise ConfigError(prefix + name, unknown_key(cls, name))
        tp = hints[name]
        kw[name] = build(tp, value, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else \
            _check(tp, value, prefix + name)
    try:
        return cls(**kw)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(prefix.rstrip(".") or "config", str(e)) from None


def _check(tp: Any, value: Any, key: str) -> Any:
    """`value` converted to `tp` where that loses nothing (int -> float), else ConfigError."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value  # checked against the choices by the section's __post_init__ (`_choices`)
    if is_union(tp):  # the type of the value's kind (a str, a table), checked as that type
        for arg in typing.get_args(tp):
            if isinstance(value, typing.get_origin(arg) or arg):
                return _check(arg, value, key)
        raise ConfigError(key, f"expected {' or '.join(_type_name(a) for a in typing.get_args(tp))}, got {value!r}")
    if origin is list:
        item = typing.get_args(tp)[0]
        if not isinstance(value, list):
            what = f"[[{key}]] tables (an array of tables)" if dataclasses.is_dataclass(item) else "a list"
            raise ConfigError(key, f"expected {what}, got {value!r}")
        if dataclasses.is_dataclass(item):  # [[data.sources]]: a table per item
            return [build(item, v, f"{key}[{i}].") for i, v in enumerate(value)]
        return [_check(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table like {{name = value}}, got {value!r}")
        return {k: _check(typing.get_args(tp)[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value  # a family config field: checked by that config when the model is built
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(key, f"expected {tp.__name__}, got {value!r}")
    return value


def is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    return "a table like {name = value}" if typing.get_origin(tp) is dict else getattr(tp, "__name__", str(tp))


def field_types(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def unknown_key(cls: Any, name: str) -> str:
    known = ", ".join(f.name for f in dataclasses.fields(cls))
    return f"unknown key {name!r} (known: {known})"

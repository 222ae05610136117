"""The record of one model family: everything the trainer, `inspect` and the data stream reach a
family through (trainkit/models/__init__.py keeps them by name).

A family is one package (`trainkit/models/pi05/`) that ends in one `Family(...)`; adding one is
that package, its configs and a `register` call. The trainer never imports a family by name, and
no trainkit module outside models/ names one: what differs per family (its export formats, the
README an export carries, its LeRobot processor steps) is a field of its record.
Shapes are functions of the batch's shape, which is datakit.loader's: B samples x K image slots
kept (the slots of a batch may be fewer than the model's after pruning).

Optional model attributes parallel/ reads (a model without them gets the default):
- `joint_attention` on a block module: its attention function, called as
  `layers.prefix_suffix_attention` (q, k, v of the prefix and of the suffix, the prefix's key mask);
  `parallel.attention = "varlen"` replaces it with the mask-free `varlen_prefix_suffix_attention`
  (parallel/attention.py). A model with no such block refuses "varlen";
- `recompute_rng` on the model (an attribute or property, default False): True when its blocks
  draw random numbers in training (dropout), so that a recomputed block replays the forward's RNG
  state (parallel/activation_checkpoint.py, `preserve_rng_state`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn

HostBatch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Activations:
    """Saved-for-backward elements of ONE sample, eager, for inspect's memory estimate."""

    blocks: dict[str, list[tuple[int, int]]]  # block list -> per block (kept without recompute, kept with: its input)
    root: int = 0  # kept outside the blocks (e.g. the patchify conv's input)


@dataclass(frozen=True, kw_only=True)
class MemoryMeasurement:
    """One measured GPU peak of a run of this repository's configs: what a family's memory
    constants are fitted to and checked against (tests/trainkit/estimate/test_trainkit_memory.py, bench/results/memory.md)."""

    config: str  # the TOML file under trainkit/configs/ the run started from
    sets: tuple[str, ...] = ()  # its `--set key=value` overrides that change the model or its memory
    world_size: int  # GPUs (ranks) of the run
    peak_gib: float  # torch.cuda.max_memory_allocated per GPU: the trainer's "peak memory (allocated)"
    source: str  # where the number is recorded: results file and run name(s)
    # the run ran out of memory: peak_gib is then the GPU's memory, a lower bound the estimate must exceed
    out_of_memory: bool = False


@dataclass(frozen=True, kw_only=True)
class MemoryCalibration:
    """The family's constants of the memory estimate (trainkit/estimate/memory.py), with the measurements
    they were fitted to (`python bench/gpu/memory_table.py --fit FAMILY`, least squares on the relative
    error, an out-of-memory run only when estimated under the GPU). The defaults are the eager count
    itself: a family with no measurement yet, or a constant none of its runs exercises."""

    saved_compiled: float = 1.0  # saved activations measured / the eager count, blocks under torch.compile
    saved_eager: float = 1.0  # the same, eager blocks
    backward_block: float = 1.0  # gradient temporaries of the block in backward / its full eager set
    # per switchable term of `Family.memory_terms` (e.g. "masked_attention", "float8"): measured
    # elements / its count; a term not listed counts as 1.0
    terms: Mapping[str, float] = field(default_factory=dict)
    # one rank without FSDP (autocast): the share of the parameters' param_dtype copy held at the turn
    # (eager autocast caches a copy of every weight; compiled blocks keep fewer)
    autocast_copy: float = 1.0
    measured: tuple[MemoryMeasurement, ...] = ()  # the runs behind the constants


class BatchAdapter(Protocol):
    """What a family adds to datakit.loader's batches, on either side of the copy to the device.
    An adapter may also carry `note` (str): one line the trainer says at launch (dreamzero on frame
    shards: its stand-in encoders), and `check(model, dtype)`: called once the weights are loaded with the
    run's compute dtype, raising a DataError when the data was made from other weights or in another
    dtype (gr00t's cached backbone)."""

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        """Host side, per batch (before the copy): the batch with the family's extra tensors
        (prompt tokens, flow noise and time, ...); `generator` is this batch's own CPU stream."""

    def model_batch(self, b: HostBatch) -> Any:
        """Device side: the normalised loader batch (with the extras) as the model's batch."""


@dataclass(frozen=True, kw_only=True)
class FrozenCache:
    """What `trainkit encode-backbone` asks of a family whose frozen front can run offline: the
    driver (trainkit/predict/encode_backbone.py) does the folder, the order and the resume, the family says
    what a sample holds and what makes it valid."""

    check: Callable[[Any], None]  # (config) -> raise one line when a cache cannot equal the model's own forward
    describe: Callable[[Any], dict[str, Any]]  # (config) -> what decides the output besides weights (fingerprint)
    digest: Callable[[nn.Module, torch.dtype], str]  # (model with its weights, dtype it runs in) -> their digest
    # (config, slots) -> per-sample field -> (dtype: None for the run's compute dtype, shape)
    fields: Callable[[Any, int], dict[str, tuple[str | None, list[int]]]]
    run: Callable[[nn.Module, Any], dict[str, torch.Tensor]]  # (model, the family's batch) -> field -> (B, *shape)


@dataclass(frozen=True, kw_only=True)
class WeightsFiles:
    """What a weights folder (model.init_from, an export) says about the model's shape, read without any
    tensor's data."""

    shapes: Mapping[str, tuple[int, ...]]  # model.safetensors' header: key -> shape
    config: Mapping[str, Any]  # config.json (LeRobot's PI05Config, openpi's converter's, ...)
    metadata: Mapping[str, str]  # model.safetensors' __metadata__ (trainkit's export: what tensors cannot say)
    folder: str = ""  # the weights folder (a family reads its other files there: gr00t's tokenizer); "": none


# config field -> (its value, where the checkpoint says so: "model.safetensors 'key' rows 128 / ...")
Fixed = dict[str, tuple[Any, str]]


@dataclass(frozen=True)
class ServingFacts:
    """What an export knows when the family writes its README.txt (trainkit/weights/serving.py)."""

    fmt: str  # the export's --format
    policy: Mapping[str, Any]  # the folder's config.json
    tokenizer_name: str | None  # the tokenizer the processor pipeline loads (None: no pipeline names one)
    carried: bool  # the run's tokenizer is in OUT/tokenizer
    pipelines: bool  # LeRobot processor files were written
    stats_file: str | None  # the statistics file of the format (openpi's norm_stats.json), None: none written
    norm: str  # the run's data.norm
    notes: tuple[str, ...]  # where the served policy would not see what the trained one saw
    hf_folder: bool = False  # tokenizer/ also holds a Hugging Face tokenizer folder (what LeRobot's step loads)

    def notes_text(self) -> str:
        return "".join(f"\nNOTE: {n}.\n" for n in self.notes)


@dataclass(frozen=True, kw_only=True)
class LeRobotBuild:
    """The model LeRobot builds from an export's config.json, computed without LeRobot
    (`Weights.lerobot_shapes`; trainkit/weights/servable.py checks an export against it)."""

    shapes: Mapping[str, tuple[int, ...]]  # its state dict: key -> shape, in its module order
    # key -> the model setting that decides its shape, named when an export's differs ("": the widths)
    settings: Mapping[str, str]
    patch_note: str = ""  # what LeRobot must be patched with to build these shapes (README.txt); "": stock LeRobot


@dataclass(frozen=True, kw_only=True)
class Weights:
    """A family's mapping to the checkpoints users have (`model.init_from`, `trainkit export`).
    A rule has `.target` (a parameter name), `.sources` (checkpoint keys) and `.gather(tensors)`."""

    formats: tuple[str, ...]  # the checkpoint formats it reads and writes ("lerobot", "openpi")
    read_plan: Callable[[Any, set[str]], tuple[str, list[Any]]]  # (config, checkpoint keys) -> (format, rules)
    # (config, trainkit state dict, format) -> the checkpoint's tensors by key; with `start_keys`, also
    # base= the start checkpoint's tensors it names
    export_tensors: Callable[..., dict[str, torch.Tensor]]
    # (config, {"cameras", "state_dim", "action_dim"}) -> the checkpoint's config.json
    config_json: Callable[[Any, Mapping[str, Any]], dict[str, Any]]
    # (checkpoint, the preset's config, the run's own model.* settings) -> every config field the
    # checkpoint fixes (`model.init_from` builds that shape: trainkit/weights/shape.py); None: the
    # family's shape always comes from its preset
    config_from: Callable[[WeightsFiles, Any, Mapping[str, Any]], Fixed] | None = None
    # (config, trainkit module path, part of a fused linear or "") -> that module's name in this family's
    # checkpoints: the names `trainkit export --format peft` writes LoRA adapters under (adapters.py);
    # None: trainkit's own module names are the checkpoint's
    peft_names: Callable[[Any, str, str], str] | None = None
    # config -> model.safetensors' __metadata__ on export: what its tensors cannot say (head counts)
    metadata: Callable[[Any], dict[str, str]] | None = None
    # (config, the run's start checkpoint's keys) -> {its key: the name export_tensors reads it under in
    # base}: tensors an export carries over from `model.init_from` beside the trained ones (GR00T's
    # other embodiments' slots); None: an export writes the trained tensors alone
    start_keys: Callable[[Any, set[str]], dict[str, str]] | None = None

    # (config, config.json, tokenizer name or None for the family's default) -> (LeRobot's processor
    # pipelines for the policy by file stem, {"policy_preprocessor": [step entries], ...}, notes on where
    # they differ from training); None: LeRobot has no pipeline for it (trainkit/weights/lerobot_processors.py)
    lerobot_processors: Callable[[Any, Mapping[str, Any], str | None],
                                 tuple[dict[str, list[dict[str, Any]]], list[str]]] | None = None
    # --format lerobot where LeRobot's policy config is not config_json's document (gr00t: GrootPolicy's
    # "groot" config naming a base folder): (config, config_json's document with the export's dtype and
    # normalization_mapping, the robot's features, OUT's final path) -> (the folder's config.json, the files
    # beside it, the tokenizer folder LeRobot's processor loads among them: OUT/tokenizer); None:
    # config_json's document is LeRobot's, the run's SentencePiece tokenizer is carried (serving.py)
    lerobot_policy: Callable[[Any, Mapping[str, Any], Mapping[str, Any], Path],
                             tuple[dict[str, Any], dict[str, bytes]]] | None = None
    # (config, the export's LeRobot config.json, lerobot_policy's files beside it) -> the state dict LeRobot
    # 0.6.1 builds from them; None: not checked. `trainkit export --format lerobot` refuses tensors that
    # differ (LeRobot itself would only warn and serve random weights: trainkit/weights/servable.py)
    lerobot_shapes: Callable[[Any, Mapping[str, Any], Mapping[str, bytes]], LeRobotBuild] | None = None
    # the export's README.txt for a format (what the folder holds, how LeRobot or openpi serves it);
    # None (or "" for a format): no README
    readme: Callable[[ServingFacts], str] | None = None
    # LeRobot processor steps (registry names) that normalise by min / max, whose state the exporter
    # fills with the run's statistics as min / max (trainkit/weights/lerobot_processors.py `min_max_stats`)
    min_max_steps: tuple[str, ...] = ()
    # (registry name, config key) of the processor step that names the tokenizer it loads
    tokenizer_step: tuple[str, str] = ("tokenizer_processor", "tokenizer_name")


@dataclass(frozen=True, kw_only=True)
class Sampler:
    """A family's action sampler at inference (`trainkit predict`): its flow-matching integration
    from noise to an action chunk, with the number of steps its reference implementation uses."""

    steps: int  # Euler steps by default (Pi0.5: 10 as openpi / LeRobot; GR00T N1.6: 4)
    # config -> the shape of each noise tensor of ONE sample (drawn per sample, so batching cannot change it)
    noise_shapes: Callable[[Any], tuple[tuple[int, ...], ...]]
    # (model, family batch, noise tensors (B, *shape) in noise_shapes' order, steps) -> the normalised
    # action chunk (B, horizon, action_dim) fp32; never reads the batch's recorded actions
    sample: Callable[..., torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family, as the trainer sees it. `Any` below is the family's config dataclass."""

    name: str  # the `model.family` word
    config: type  # the config dataclass: kw_only, a comment per field, checks in __post_init__
    presets: Mapping[str, Callable[[], Any]]  # preset name -> config; `model.<field>` overrides apply on top
    # config -> model: an nn.Module with BLOCK_LISTS (names of its nn.ModuleList block lists),
    # init_weights() (from the global torch RNG, after to_empty) and forward(batch) -> scalar loss
    model: Callable[[Any], nn.Module]
    frozen: tuple[str, ...] = ()  # block lists built with requires_grad False (no gradient, no optimiser state)
    # (config, image slots of the batch) -> model FLOPs of one sample: trained parts 3x their
    # forward (forward + backward), frozen parts 1x (forward only); with LoRA (`lora_rank`) what runs:
    # frozen weights' forward and input gradients, adapters 3x (docs/fine-tuning.md); no recompute
    flops_per_sample: Callable[[Any, int], float]
    # (config, image slots) -> token counts of one sample; "sequence" is what tokens/s counts
    tokens_per_sample: Callable[[Any, int], dict[str, int]]
    activations: Callable[[Any, int], Activations]  # (config, image slots) -> inspect's saved elements
    # (config, image slots, {"attention": parallel.attention, "float8": {FP8 linear's name: in_features}})
    # -> {term: {block list: elements per block of one sample}}: what a config switch adds to (or, negative,
    # takes from) each block's eager count, weighted by `MemoryCalibration.terms`; None: no such switch
    memory_terms: Callable[[Any, int, Mapping[str, Any]], dict[str, dict[str, list[int]]]] | None = None
    max_slots: Callable[[Any], int]  # config -> the model's image slots
    # the loader preset: (config, index, **trainer's loader settings) -> datakit LoaderConfig with
    # what the model needs from a sample (frames per sample, action horizon, image size, tiling);
    # index None (`trainkit inspect` without shards): what does not depend on the data
    # (trainkit/data.py `loader_settings` are the trainer's settings, built once for both)
    loader_config: Callable[..., Any]
    # (config, index, the loader's Normaliser: its LoaderConfig in `.cfg`, and the host copy of the
    # state statistics, a mixture's per source) -> the batch adapter (host extras + model batch)
    batches: Callable[[Any, Any, Any], BatchAdapter]
    # (config, feature index, the folder) -> the batch adapter on a `datakit encode` feature folder,
    # refusing one that does not fit the config (trainkit/data.py); None: the family trains from frames only
    feature_batches: Callable[[Any, Any, str], BatchAdapter] | None = None
    # its frozen front (a VL backbone) run offline into a feature folder that `feature_batches` reads
    # (`trainkit encode-backbone`, trainkit/predict/encode_backbone.py); None: nothing to cache
    frozen_cache: FrozenCache | None = None
    memory: MemoryCalibration = MemoryCalibration()  # inspect's memory constants and their measurements
    weights: Weights | None = None  # checkpoint mapping (model.init_from, trainkit export); None: random init only
    sampler: Sampler | None = None  # action sampler (trainkit predict); None: the family cannot predict actions
    # "state" / "action" -> the config field bounding the robot's channels (zero-padded up to it);
    # a dataset with more is refused at launch (trainkit/weights/norm_stats.py `check_robot_dims`)
    robot_dims: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        blocks = getattr(self.model, "BLOCK_LISTS", None)
        if blocks is None or not set(self.frozen) <= set(blocks):
            raise TypeError(f"family {self.name!r}: frozen {self.frozen} must name block lists of "
                            f"{getattr(self.model, '__name__', self.model)}.BLOCK_LISTS ({blocks})")

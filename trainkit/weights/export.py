"""`trainkit export RUN_DIR OUT --format lerobot|openpi`: a run's newest intact checkpoint as the
weights users serve with, `model.safetensors` + `config.json` in the family's checkpoint format
(trainkit/models/pi05/weights.py), loadable by LeRobot's `PI05Policy.from_pretrained` and by
`model.init_from` again.

    trainkit export runs/pi05 out/pi05_lerobot --format lerobot      # keys prefixed `model.`
    trainkit export runs/pi05 out/pi05_base --format openpi --dtype bfloat16   # pi05_base's format
    trainkit export runs/pi05 out/pi05_ema --format lerobot --weights ema      # the weight EMA
    trainkit export runs/mix out/mix_libero --format lerobot --source libero   # one robot of a mixture
    trainkit export runs/dz_lora out/dz_adapters --format peft                 # LoRA adapters, peft's layout

A LoRA run (`model.lora_rank > 0`) exports in a family format with its adapters merged into the
base weights (base + alpha / r B @ A), or with `--format peft` as the adapters alone (adapters.py).

The model is rebuilt from the config the checkpoint holds (trainkit.json) on the CPU and only its
weights are read from the DCP folder (through checkpoint/reader.py: nothing in it can run code);
the Adam moments are not read. config.json names the robot's cameras and state/action sizes from
the run's dataset index when it is still there (else the model's slots and 32 channels, said so);
a run on a mixture (data.sources) exports one source's (`--source NAME`, export_source.py): its
cameras as its slots mapped them, its sizes, the statistics the loader normalised it with.
Beside them what serving needs (trainkit/weights/serving.py): for LeRobot its processor pipelines
with the statistics the run trained with, so that `make_pre_post_processors(cfg, pretrained_path=OUT)`
and `select_action` run on a raw observation; for openpi its norm_stats.json; the run's tokenizer;
a README.txt on what else LeRobot or openpi need.

Servable or refused (issue 35): for --format lerobot every tensor is compared with the state dict
LeRobot 0.6.1 builds from the exported config.json (servable.py), before anything is written: LeRobot
itself only warns on a size mismatch and serves random weights; README.txt says where LeRobot builds
the model only patched (tiny widths).

Failing safe (issue 25): OUT inside the run directory (its rotation would delete it) or the dataset
is refused; OUT is written under a working name and renamed when complete, an existing non-empty
OUT only replaced whole with --force (trainkit/weights/publish.py: the marker readers require).
The checkpoint read is held against the run's rotation (trainkit/checkpoint/hold.py); a newer
damaged one is named as a resume names it; a manifest whose config builds another model than its
tensors (an edited preset), a planted tensor file, an unwritable or full OUT: one line each.
"""
from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from trainkit.checkpoint.dcp import Found, _cause, find_checkpoint
from trainkit.checkpoint.manifest import MANIFEST_NAME
from trainkit.checkpoint.reader import METADATA_NAME, CheckedReader, TensorsOnlyPlanner, UnsafeCheckpoint, read_metadata
from trainkit.config import RunConfig, config_from_dict
from trainkit.config.data import SourceConfig
from trainkit.errors import CheckpointError, ExportError, WeightsError
from trainkit.models import build_model, family
from trainkit.models.lora import lora_layers, merged_state, without_lora
from trainkit.weights.adapters import adapter_files, write_adapters
from trainkit.weights.export_source import chosen_source, source_notes
from trainkit.weights.load import WEIGHTS_NAME, read_weights_folder, read_tensors, write_weights
from trainkit.weights.norm_stats import LEROBOT_MODE, with_weights_stats
from trainkit.weights.publish import DATA_WHY, check_out, refuse_overlap, seal, staged
from trainkit.weights.servable import servable_problem
from trainkit.weights.serving import README, serving_files

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PEFT = "peft"  # --format peft: a LoRA run's adapters alone (adapters.py), any family


def load_run_model(run_dir: str | Path, weights: str = "model", hold: ExitStack | None = None,
                   check: Callable[[RunConfig], Any] | None = None
                   ) -> tuple[nn.Module, RunConfig, Path]:
    """The model of the newest intact checkpoint of `run_dir` (on the CPU, float32), its run's
    config and the checkpoint folder; newer damaged ones are named on stderr. `weights = "ema"`:
    the trainable parameters from the checkpoint's weight EMA (`ema.<name>`, written when the run
    had train.ema_decay > 0). `hold`: the checkpoint stays held against the run's rotation on it.
    `check`: called with the run's config before any weight is read (a refusal costs no load)."""
    found = find_checkpoint(Path(run_dir), hold=hold)
    if found is None:
        raise CheckpointError(str(Path(run_dir) / "checkpoints"), "no checkpoint to export (set output.checkpoint_every)")
    for line in found.skip_lines("exporting"):
        print(f"trainkit: {line}", file=sys.stderr)
    cfg, model = _meta_model(found)
    if check is not None:
        check(cfg)
    files = set(found.manifest.files)
    try:
        md = read_metadata(found.path, files)
    except UnsafeCheckpoint as e:
        raise CheckpointError(str(found.path / METADATA_NAME), f"refused: {e}; nothing from it was run") from None
    except OSError as e:  # deleted since it was checked (no hold could be taken)
        raise CheckpointError(str(found.path / METADATA_NAME), f"unreadable ({e.strerror})") from None
    _check_shapes(found, model, md)
    model.to_empty(device="cpu")
    state = {"model": model.state_dict()}
    if weights == "ema":
        if not found.manifest.config.get("train", {}).get("ema_decay"):
            raise CheckpointError(str(found.path), "holds no weight EMA (the run had no train.ema_decay); "
                                  "export --weights model")
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        state["ema"] = {n: torch.empty_like(t) for n, t in state["model"].items() if n in trained}  # own storage
    _read(found, state)
    model.load_state_dict({**state["model"], **state.get("ema", {})})
    return model, cfg, found.path


def _meta_model(found: Found) -> tuple[RunConfig, nn.Module]:
    """The run's config and its model on the meta device, from the checkpoint's manifest. The
    manifest is as untrusted as the folder: a config that builds no model (an edited preset or
    family, a bad override) is refused naming it."""
    try:
        cfg = config_from_dict(found.manifest.config)
        with torch.device("meta"):
            model = build_model(cfg.model.family, cfg.model.preset, cfg.model.overrides)
    except Exception as e:  # noqa: BLE001 - whatever an edited config makes fail, the manifest is at fault
        raise CheckpointError(str(found.path / MANIFEST_NAME), f"its config builds no model ({_cause(e)})") from None
    return cfg, model


def _check_shapes(found: Found, model: nn.Module, md: Metadata) -> None:
    """The model the manifest describes has exactly the checkpoint's `model.*` tensors, at their
    shapes: checked on the meta device, before the weights are allocated (an edited preset "full"
    would otherwise allocate 3B parameters, or a smaller model load a subset and export it)."""
    saved = {k.removeprefix("model."): tuple(getattr(v, "size", ())) for k, v in md.state_dict_metadata.items()
             if k.startswith("model.")}
    problem = _shape_problem(saved, {k: tuple(t.shape) for k, t in model.state_dict().items()})
    if problem:
        m = found.manifest.config.get("model", {})
        raise CheckpointError(str(found.path / MANIFEST_NAME), f"its config's model ({m.get('family')} "
                              f"{m.get('preset')}) is not the checkpoint's: {problem}")


def _shape_problem(saved: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]]) -> str | None:
    """The first difference between the checkpoint's tensors (`saved`) and the model's (`want`)."""
    for k in sorted(saved.keys() | want.keys()):
        if k not in saved:
            return f"model.{k} is not among the checkpoint's tensors"
        if k not in want:
            return f"the checkpoint's model.{k} is not in it"
        if saved[k] != want[k]:
            return f"model.{k} is {list(saved[k])} in the checkpoint, {list(want[k])} in the model"
    return None


def _read(found: Found, state: dict[str, Any]) -> None:
    """DCP's read of `state` from the checkpoint, any failure one line (a planted tensor file whose
    checksum was resealed, a file deleted mid-read where no hold could be taken)."""
    try:
        with _quiet():
            dcp.load(state, storage_reader=CheckedReader(found.path, set(found.manifest.files)),
                     planner=TensorsOnlyPlanner())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's failure in a BaseException
        raise CheckpointError(str(found.path), f"cannot be read ({_cause(e)}); nothing was exported") from None


class _DropAll(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP's notes to stderr silenced: its "assuming a single process" warning, torch.load's, and
    the tracebacks it logs on the root logger before raising (the raise is what the user gets)."""
    root, drop = logging.getLogger(), _DropAll()
    root.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        root.removeFilter(drop)


def _dataset(cfg: RunConfig, max_slots: int, source: SourceConfig | None = None) -> tuple[dict[str, Any], Any]:
    """The robot's cameras and state/action sizes, and the run's statistics, from the run's dataset
    index (or model.init_from's, for data.norm_from = "checkpoint"; a mixture's `source`: that
    source's own index, cameras through its slots) when readable; else (generic features, None), said so."""
    from datakit.shards.index import load_index

    generic = ({"cameras": [f"observation.images.slot{i}" for i in range(max_slots)], "state_dim": 32,
                "action_dim": 32}, None)
    said = f"config.json names {max_slots} generic cameras and 32 state/action channels, and no statistics are written"
    root, slots = (cfg.data.shards, cfg.data.slots) if source is None else (source.shards,
                                                                            source.slots or cfg.data.slots)
    try:
        index = load_index(Path(root))
    except Exception as e:  # noqa: BLE001 - moved, deleted or remote: the weights still export
        print(f"trainkit: {root}: dataset index unreadable ({type(e).__name__}); {said}", file=sys.stderr)
        return generic
    if cfg.data.norm_from == "checkpoint":  # one folder only (a mixture's config refuses it)
        index, _ = with_weights_stats(index, cfg.model.init_from, cfg.data.norm)
    # the loader's slots (trainkit/data.py): the source's, else data.slots, else the index's cameras;
    # a slot left empty ("") is not a camera the robot gives (LeRobot masks what the observation lacks)
    cams = [c for c in slots if c] or list(index.cameras)
    features = {"cameras": cams, "state_dim": len(index.state_names), "action_dim": len(index.action_names)}
    return features, {k: index.stats[k] for k in ("state", "action")}


def _start_tensors(cfg: RunConfig, fam: Any, model_cfg: Any) -> dict[str, torch.Tensor]:
    """The tensors of the run's start checkpoint (model.init_from) the family carries into an export
    (`Weights.start_keys`), under the names it asks; {} for a run from a random init, said so."""
    if not cfg.model.init_from:
        print("trainkit: the run started from a random init (no model.init_from): the export's tensors of "
              "other embodiments / parts it never trained are zeros", file=sys.stderr)
        return {}
    keys = read_weights_folder(cfg.model.init_from).shapes
    try:
        wanted = fam.weights.start_keys(model_cfg, set(keys))
    except WeightsError as e:
        raise CheckpointError(cfg.model.init_from, str(e)) from None
    return read_tensors(cfg.model.init_from, wanted)


def export_run(run_dir: str | Path, out: str | Path, fmt: str, dtype: str = "float32", weights: str = "model",
               force: bool = False, tokenizer_name: str | None = None, source: str | None = None) -> Path:
    """Write the export of `run_dir`'s newest checkpoint to `out` (its trained weights, or with
    `weights = "ema"` its weight EMA), replacing an existing non-empty `out` only with `force`;
    returns the checkpoint exported. OUT appears complete or not at all (publish.py). Beside the
    weights, what serving needs (serving.py); `tokenizer_name`: the tokenizer LeRobot's pipeline
    loads (default: the run's model.tokenizer, carried in OUT/tokenizer). `source`: a mixture's
    run is exported for that one source (required there, refused on one folder: export_source.py)."""
    out = check_out(Path(out), Path(run_dir), force)
    with ExitStack() as held, staged(out, force) as tmp:
        # --source checked against the checkpoint's config before its weights are read
        model, cfg, path = load_run_model(run_dir, weights, hold=held,
                                          check=lambda c: chosen_source(c, source, run_dir))
        mine = chosen_source(cfg, source, run_dir)  # a mixture's source (None: one folder)
        for root in cfg.data.roots:  # data.shards, or each source of a mixture
            refuse_overlap(out, root, "data.shards", DATA_WHY)
        fam = family(cfg.model.family)
        if fam.weights is None:
            raise CheckpointError(str(run_dir), f"family {fam.name!r} has no checkpoint mapping to export to")
        if fmt == PEFT:
            _export_adapters(model, cfg, fam, path, tmp, dtype)
            seal(tmp, out, {"checkpoint": str(path.resolve()), "step": int(path.name.removeprefix("step-")),
                            "weights": weights, "export_format": fmt, "dtype": dtype})
            return path
        if fmt not in fam.weights.formats:
            raise CheckpointError(str(out), f"--format {fmt!r}: {fam.name} exports {', '.join(fam.weights.formats)}")
        try:
            extra = {"base": _start_tensors(cfg, fam, model.cfg)} if fam.weights.start_keys else {}
            # a LoRA run exports its adapters merged: the plain model's state (trainkit/models/lora.py)
            state = merged_state(model) if lora_layers(model) else model.state_dict()
            tensors = fam.weights.export_tensors(without_lora(model.cfg), state, fmt, **extra)
        except WeightsError as e:
            raise CheckpointError(str(path), str(e)) from None
        # one copy each: the fused tensors' parts are views, and safetensors refuses tensors sharing memory
        tensors = {k: v.to(DTYPES[dtype], copy=True) for k, v in tensors.items()}
        features, stats = _dataset(cfg, fam.max_slots(model.cfg), mine)
        config = fam.weights.config_json(model.cfg, features)
        config["dtype"] = dtype
        mode = LEROBOT_MODE[cfg.data.norm]
        config["normalization_mapping"] = {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}
        policy_files: dict[str, bytes] = {}
        if fmt == "lerobot" and fam.weights.lerobot_policy is not None:  # LeRobot's own policy config (gr00t)
            config, policy_files = fam.weights.lerobot_policy(model.cfg, config, features, out)
        build = fam.weights.lerobot_shapes(model.cfg, config, policy_files) \
            if fmt == "lerobot" and fam.weights.lerobot_shapes is not None else None
        problem = servable_problem(tensors, build) if build is not None else None
        if problem:  # LeRobot would only warn and serve random weights (servable.py)
            raise ExportError(out, problem)
        side, notes = serving_files(fam, model.cfg, config, stats, cfg.data.norm, fmt, out, tokenizer_name,
                                    source_notes(mine) if mine else [])
        side = {**policy_files, **side}
        if build is not None and build.patch_note and README in side:  # README.txt says what LeRobot needs
            side[README] += f"\n{build.patch_note}.\n".encode()
        _write(out, tmp, tensors, config, side, fam.weights.metadata(model.cfg) if fam.weights.metadata else {})
        which = {"source": mine.label, "prompt": mine.prompt} if mine else {}
        seal(tmp, out, {"checkpoint": str(path.resolve()), "step": int(path.name.removeprefix("step-")),
                        "weights": weights, "export_format": fmt, "dtype": dtype, **which})
    for note in notes:  # once the export is in place: a failed one says only why it failed
        print(f"trainkit: note: {note}", file=sys.stderr)
    return path


def _export_adapters(model: nn.Module, cfg: RunConfig, fam: Any, path: Path, tmp: Path, dtype: str) -> None:
    """--format peft: the run's LoRA adapters in peft's layout (adapters.py) into `tmp`."""
    if not lora_layers(model):
        raise CheckpointError(str(path), "--format peft: the run trained no LoRA adapters (model.lora_rank = 0); "
                              f"export its whole model as one of {', '.join(fam.weights.formats)}")
    peft_names = fam.weights.peft_names
    names = (lambda p, part: peft_names(model.cfg, p, part)) if peft_names else (lambda p, part: p)
    tensors, config = adapter_files(model, names, cfg.model.init_from, DTYPES[dtype])
    try:
        write_adapters(tmp, tensors, config)
    except OSError as e:
        raise ExportError(tmp, f"cannot be written ({e.strerror or e})") from None


def _write(out: Path, tmp: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any],
           extra: dict[str, bytes], metadata: dict[str, str]) -> None:
    """The export's files into the working folder `tmp`; a failure (a full disk, a size limit, a
    disk gone read-only) is one line naming OUT."""
    from safetensors import SafetensorError

    try:
        write_weights(tmp, tensors, config, extra, metadata)
    except SafetensorError as e:  # safetensors' own writer: its I/O errors come as this, not OSError
        raise ExportError(out, f"cannot write {WEIGHTS_NAME} ({' '.join(str(e).split())})") from None
    except OSError as e:
        raise ExportError(out, f"cannot be written ({e.strerror or e})") from None

"""The weights users have, in and out: `model.init_from` reads a folder of `model.safetensors` +
`config.json` (LeRobot's or openpi's format) into a built model through its family's mapping
(`Family.weights`, e.g. trainkit/models/pi05/weights.py); `write_weights` writes one (`trainkit export`).
The weights may also be sharded safetensors with their index (`model.safetensors.index.json`, as
`save_pretrained` shards large models), or diffusers' `diffusion_pytorch_model.safetensors` (one
file or sharded with its index): the files' headers are read together as one checkpoint.

    info = load_weights(model, fam, "ckpt/pi05_base", say)    # after to_empty + init_weights, before step 0

Loading reads tensor by tensor from the memory-mapped file (safetensors' `safe_open`): each
parameter's sources are read, moved to the parameter's device, combined by the family's rule in
float32, cast to the parameter's dtype, and under FSDP2 each rank keeps only its own shard (`distribute_tensor(src_data_rank=None)`
splits locally, no communication: every rank reads the same file). Peak host memory is one
parameter (the 2 GB float32 embedding at full size), never the model; on the device, one parameter
more than the model.
Before any tensor is read, the plan is checked on the file's header alone: a damaged or foreign
file (safetensors_file.py: truncated, overlapping offsets, a pickle named model.safetensors...), an
unknown format, a source key the file lacks, a parameter no rule fills, a shape that differs, or a
source that is not floating point (an integer or bool tensor would be cast silently) is refused
with one line naming the file and the key. While loading, each tensor is checked finite in float32
(NaN/inf weights, or float64 values beyond float32's range): one bad value would otherwise surface
at step 0 as a non-finite loss blamed on the batch or the learning rate. Checkpoint keys no rule
reads (tensors the flow loss never uses) are counted in the log line. A rule with no sources keeps
the parameter's own initial value (a part the checkpoint does not hold: DreamZero's action MLPs on a
Wan base DiT, fresh LoRA adapters); those are counted in the log line too. A resume never comes
here: it reloads trainkit's own DCP checkpoint.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

from datakit.durable import write_atomic
from trainkit.errors import CheckpointError, WeightsError
from trainkit.models import WeightsFiles, Family
from trainkit.models.lora import lora_layers, rename_plan, without_lora
from trainkit.parallel.names import clean_name
from trainkit.weights.norm_stats import inside_weights_folder
from trainkit.weights.publish import check_export_folder
from trainkit.weights.safetensors_file import FLOAT_DTYPES, Entry, read_header_and_metadata

WEIGHTS_NAME, CONFIG_NAME = "model.safetensors", "config.json"
# the weight files a folder may hold, in the order looked for: one file, or shards named by an index
WEIGHT_STEMS = (WEIGHTS_NAME, "diffusion_pytorch_model.safetensors")


def weight_files(folder: Path) -> tuple[list[Path], Path | None, dict[str, str]] | None:
    """The folder's safetensors files (one, or the shards its index names), the index and its weight
    map (key -> shard name; None and empty for one file); None: none found. Each file must resolve inside the
    folder (a symlink out is refused; a Hugging Face snapshot's links into its blobs/ are not)."""
    for name in WEIGHT_STEMS:
        if (folder / name).is_file():
            return [inside_weights_folder(folder, name, folder, "weight file")], None, {}
        index = folder / f"{name}.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                names = sorted(set(weight_map.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
                raise CheckpointError(str(index), f"not a safetensors index ({type(e).__name__}: {str(e)[:200]})") from None
            for n in names:
                if not isinstance(n, str) or "/" in n or not (folder / n).is_file():
                    raise CheckpointError(str(index), f"names shard {str(n)[:200]!r}, which the folder lacks")
            return [inside_weights_folder(folder, n, index, "shard") for n in names], index, weight_map
    return None


def _read_folder(folder: Path) -> tuple[dict[str, Entry], WeightsFiles, dict[str, Path]]:
    """(the checked header of the folder's weights, what the folder says about the model's shape,
    the file holding each key)."""
    found = weight_files(folder)
    files, index, weight_map = found or ([], None, {})
    for name, missing in ((WEIGHTS_NAME, found is None), (CONFIG_NAME, not (folder / CONFIG_NAME).is_file())):
        if missing:
            raise CheckpointError(str(folder / name), "model.init_from needs a folder with model.safetensors (or "
                                  "its shards and index, or diffusers' diffusion_pytorch_model.safetensors) and "
                                  "config.json (LeRobot's save_pretrained or openpi's converter); this file is missing")
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, ValueError, RecursionError) as e:  # bad JSON, not UTF-8, unreadable, nested too deep
        raise CheckpointError(str(folder / CONFIG_NAME), f"unreadable ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(config, dict):
        raise CheckpointError(str(folder / CONFIG_NAME), f"a JSON {type(config).__name__}, not a JSON object")
    header: dict[str, Entry] = {}
    where: dict[str, Path] = {}
    metadata: dict[str, str] = {}
    for path in files:
        part, md = read_header_and_metadata(path)
        metadata = metadata or md
        for key, entry in part.items():
            if key in header:
                raise CheckpointError(str(path), f"tensor {key!r} is also in {where[key].name}")
            header[key], where[key] = entry, path
            if index is not None and weight_map.get(key) != path.name:
                raise CheckpointError(str(index), f"maps tensor {key!r} to {weight_map.get(key)!r}; it is in "
                                      f"{path.name}")
    return header, WeightsFiles(shapes={k: e.shape for k, e in header.items()}, config=config,
                                   metadata=metadata, folder=str(folder)), where


def read_weights_folder(folder: str | Path) -> WeightsFiles:
    """What the weights folder says about the model's shape (no tensor data read), checked:
    trainkit/weights/shape.py builds the model from it."""
    return _read_folder(Path(folder))[1]


class _Reader:
    """safetensors' readers of every file of a checkpoint, each tensor read from the file holding it."""

    def __init__(self, where: Mapping[str, Path]):
        from safetensors import SafetensorError, safe_open

        self.where = where
        self.files: dict[Path, Any] = {}
        for path in sorted(set(where.values())):
            try:
                self.files[path] = safe_open(str(path), framework="pt", device="cpu")
            except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # changed since the check
                raise CheckpointError(str(path), f"unreadable safetensors ({type(e).__name__}: {str(e)[:200]})") from None

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.files.clear()

    def get_tensor(self, key: str) -> torch.Tensor:
        return self.files[self.where[key]].get_tensor(key)


def _open(folder: Path) -> tuple[dict[str, Entry], _Reader]:
    """(the checked header, a reader) of the folder's weights."""
    check_export_folder(folder)  # an unfinished or incomplete trainkit export (publish.py)
    header, _, where = _read_folder(folder)
    return header, _Reader(where)


def read_tensors(folder: str | Path, wanted: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """{name: tensor} of the checkpoint's keys `wanted` ({key: name}), each checked finite in float32
    (`trainkit export` carries them over from a run's start checkpoint: `Weights.start_keys`)."""
    header, f = _open(Path(folder))
    with f:
        missing = sorted(set(wanted) - set(header))
        if missing:
            raise CheckpointError(str(Path(folder)), f"missing key {missing[0]!r}")
        out = {}
        for key, name in wanted.items():
            out[name] = _read(f, f.where[key], key)
            _check_finite(f.where[key], key, out[name].float())
        return out


def check_weights(model: nn.Module, fam: Family, folder: str | Path) -> str:
    """The checkpoint's format, after checking its plan against `model` (may be on the meta device)
    from the file's header alone: the launch check, before any GPU work."""
    header, f = _open(Path(folder))
    with f:
        return _plan(model, fam, Path(folder), header, f.where)[0]


def _plan(model: nn.Module, fam: Family, folder: Path, header: Mapping[str, Entry],
          where: Mapping[str, Path]) -> tuple[str, list[Any]]:
    files = sorted(set(where.values()))
    path = str(files[0] if len(files) == 1 else folder)
    fmt, rules = plan(model, fam, {k: e.shape for k, e in header.items()}, path)
    for rule in rules:
        for key in rule.sources:
            if header[key].dtype not in FLOAT_DTYPES:
                raise CheckpointError(str(where[key]), f"tensor {key!r} is {header[key].dtype}, not floating point "
                                      f"(weights are {'/'.join(FLOAT_DTYPES)}; it would be cast silently)")
    return fmt, rules


def plan(model: nn.Module, fam: Family, shapes: Mapping[str, tuple[int, ...]], path: str) -> tuple[str, list[Any]]:
    """(format, rules) for a checkpoint of tensors `shapes` (key -> shape; `path` names it in errors),
    checked against `model`'s parameters: refuses a missing key, a parameter without a rule, a shape
    that differs."""
    if fam.weights is None:
        raise CheckpointError(path, f"model.init_from: family {fam.name!r} has no checkpoint mapping")
    try:  # a LoRA model reads the plain model's layout into its base layers (trainkit/models/lora.py)
        fmt, rules = fam.weights.read_plan(without_lora(model.cfg), set(shapes))
    except WeightsError as e:
        raise CheckpointError(path, str(e)) from None
    if lora_layers(model):
        rules = rename_plan(model, rules)
    _check_plan(path, rules, {clean_name(n): p for n, p in model.named_parameters()}, shapes)
    return fmt, rules


def load_weights(model: nn.Module, fam: Family, folder: str | Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Fill every parameter of `model` from the checkpoint folder; returns what the log line says
    (format, tensors, dtypes, unused keys, seconds)."""
    t0 = time.perf_counter()
    folder = Path(folder)
    params = {clean_name(n): p for n, p in model.named_parameters()}
    header, f = _open(folder)
    with f:
        keys = set(header)
        fmt, rules = _plan(model, fam, folder, header, f.where)
        dtypes: set[str] = set()
        with torch.no_grad():
            for rule in rules:
                if not rule.sources:
                    continue  # kept at its init
                param = params[rule.target]
                sources = [_read(f, f.where[k], k) for k in rule.sources]
                dtypes |= {str(t.dtype).removeprefix("torch.") for t in sources}
                # combined on the parameter's device: bf16 files cross to the GPU at half the bytes
                combined = [t.to(param.device).float() for t in sources]
                for key, t in zip(rule.sources, combined):
                    _check_finite(f.where[key], key, t)
                full = rule.gather(combined)
                if len(combined) > 1:  # combined (a LoRA merge): finite sources may still overflow
                    _check_finite(f.where[rule.sources[0]], f"{rule.target} (merged from {', '.join(rule.sources)})",
                                  full.float())
                _copy_into(param, full)
    used = {k for r in rules for k in r.sources}
    kept = sum(not r.sources for r in rules)
    info = {"folder": str(folder), "layout": fmt,  # the key summary.json has always had (its value is the format)
            "tensors": len(rules) - kept, "kept_at_init": kept, "dtypes": sorted(dtypes),
            "unused_keys": len(keys - used), "seconds": time.perf_counter() - t0}
    fresh = f"; {kept} kept at their init (not in the checkpoint)" if kept else ""
    say(f"model.init_from {folder}: {fmt} format, {len(rules) - kept} parameters from {len(used)} tensors "
        f"({'/'.join(info['dtypes'])}){fresh}; {info['unused_keys']} keys not used by the flow loss; "
        f"{info['seconds']:.1f} s")
    return info


def _read(f: Any, path: Path, key: str) -> torch.Tensor:
    from safetensors import SafetensorError

    try:
        return f.get_tensor(key)
    except (SafetensorError, OSError, RuntimeError) as e:  # the file changed or went away under the run
        raise CheckpointError(str(path), f"tensor {key!r} unreadable ({type(e).__name__}: {str(e)[:200]})") from None


def _check_finite(path: Path, key: str, t: torch.Tensor) -> None:
    """Refuse a source tensor (as float32, on the parameter's device) holding NaN or inf. The test
    is its float64 sum, finite exactly when every value is (float32 values cannot overflow it), so
    no mask the size of the tensor is allocated unless one is bad."""
    if not math.isfinite(t.sum(dtype=torch.float64).item()):
        bad = int((~torch.isfinite(t)).sum())
        raise CheckpointError(str(path), f"tensor {key!r} holds {bad} of {t.numel()} values not finite in float32 "
                              "(NaN, inf, or beyond float32's range); refused before step 0")


def _check_plan(path: str, rules: list[Any], params: Mapping[str, torch.Tensor],
                shapes: Mapping[str, tuple[int, ...]]) -> None:
    targets = {r.target for r in rules}
    unfilled = sorted(set(params) - targets)
    if unfilled:
        raise CheckpointError(path, f"the mapping fills no value for parameter {unfilled[0]!r}")
    for rule in rules:
        if rule.target not in params:
            raise CheckpointError(path, f"the mapping names parameter {rule.target!r}, which this model lacks")
        if not rule.sources:
            continue  # kept at its init
        missing = [k for k in rule.sources if k not in shapes]
        if missing:
            raise CheckpointError(path, f"missing key {missing[0]!r} (for {rule.target})")
        metas = [torch.empty(shapes[k], device="meta") for k in rule.sources]
        try:
            shape = tuple(rule.gather(metas).shape)
        except RuntimeError:  # sources that cannot even be concatenated
            shape = tuple(tuple(m.shape) for m in metas)
        except WeightsError as e:  # sources the family cannot combine (a LoRA of rank 0)
            raise CheckpointError(path, str(e)) from None
        want = tuple(params[rule.target].shape)
        if shape != want:
            given = ", ".join(f"{k} {list(m.shape)}" for k, m in zip(rule.sources, metas))
            raise CheckpointError(path, f"shape mismatch for {rule.target}: the model has {list(want)}, "
                                  f"the checkpoint gives {list(shape)} ({given})")


def _copy_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into a parameter; an FSDP2 (DTensor) parameter takes only its shard."""
    if isinstance(param, DTensor):
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)


def write_weights(out: Path, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any],
                  extra: Mapping[str, bytes] = {}, metadata: Mapping[str, str] = {}) -> None:
    """Write `model.safetensors` (with `metadata` in its header) + `config.json` (+ `extra` files)
    into `out` (created), each file atomically and fsynced; model.safetensors gets config.json's mode
    (safetensors' writer makes it 0600)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS_NAME + ".tmp")
    save_file(dict(tensors), str(tmp), metadata=dict(metadata) or None)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.rename(out / WEIGHTS_NAME)
    write_atomic(out / CONFIG_NAME, (json.dumps(config, indent=4) + "\n").encode())
    os.chmod(out / WEIGHTS_NAME, (out / CONFIG_NAME).stat().st_mode & 0o777)
    for name, data in extra.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out / name, data)

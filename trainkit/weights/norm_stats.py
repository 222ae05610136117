"""Normalisation statistics a checkpoint was trained with: read for `data.norm_from = "checkpoint"`,
written with every `trainkit export`.

A fine-tune must normalise state and actions as the checkpoint's training did, or with its own
dataset's statistics (`data.norm_from = "dataset"`, the default: the shard index's). Formats:
- LeRobot: `policy_preprocessor.json`, whose `normalizer_processor` step names a safetensors file
  of `observation.state.<stat>` and `action.<stat>` tensors (mean, std, min, max, q01, q99);
- openpi: `assets/<asset id>/norm_stats.json`, `{"norm_stats": {"state": {...}, "actions": {...}}}`
  (mean, std, q01, q99).
The statistics replace the index's in the run's `ShardIndex` (`with_checkpoint_stats`), so the
loader, the host normaliser and the prompt's state bins all use them; the robot's state and action
sizes must match the dataset's. A resumed run reads them again from `model.init_from`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from datakit.shards.index import ShardIndex
from trainkit.errors import CheckpointError
from trainkit.weights.publish import check_export_folder

Stats = dict[str, dict[str, list[float]]]  # "state" / "action" -> stat name -> values
PREPROCESSOR, POSTPROCESSOR = "policy_preprocessor.json", "policy_postprocessor.json"
NEEDED = {"quantile": ("q01", "q99"), "mean_std": ("mean", "std"), "none": ()}
_LEROBOT_KEYS = {"state": "observation.state", "action": "action"}
LEROBOT_MODE = {"quantile": "QUANTILES", "mean_std": "MEAN_STD", "none": "IDENTITY"}  # data.norm -> LeRobot's


def read_checkpoint_stats(folder: str | Path) -> tuple[Stats, Path]:
    """(statistics, the file they came from) of a checkpoint folder; CheckpointError if it has none."""
    folder = Path(folder)
    check_export_folder(folder)  # an unfinished or incomplete trainkit export (publish.py)
    pre = folder / PREPROCESSOR
    if pre.is_file():
        return _read_lerobot(pre), pre
    found = sorted(folder.glob("assets/*/norm_stats.json"))
    if found:
        try:
            raw = json.loads(found[0].read_text())["norm_stats"]
            return {"state": _lists(raw["state"]), "action": _lists(raw["actions"])}, found[0]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(str(found[0]), f"not openpi norm stats ({type(e).__name__}: {e})") from None
    raise CheckpointError(str(folder), f"data.norm_from = 'checkpoint': no {PREPROCESSOR} (LeRobot) or "
                          "assets/*/norm_stats.json (openpi) in model.init_from")


def _lists(d: dict[str, Any]) -> dict[str, list[float]]:
    return {k: [float(x) for x in v] for k, v in d.items() if isinstance(v, list)}


def _read_lerobot(path: Path) -> Stats:
    from safetensors.torch import load_file

    try:
        steps = json.loads(path.read_text())["steps"]
        step = next(s for s in steps if s.get("registry_name") == "normalizer_processor" and s.get("state_file"))
        tensors = load_file(str(path.parent / step["state_file"]))
    except StopIteration:
        raise CheckpointError(str(path), "has no normalizer_processor step with a state_file") from None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(str(path), f"unreadable LeRobot processor ({type(e).__name__}: {e})") from None
    out: Stats = {"state": {}, "action": {}}
    for key, tensor in tensors.items():
        feature, _, stat = key.rpartition(".")
        for ours, theirs in _LEROBOT_KEYS.items():
            if feature == theirs:
                out[ours][stat] = tensor.flatten().double().tolist()
    return out


def with_checkpoint_stats(index: ShardIndex, folder: str | Path, norm: str) -> tuple[ShardIndex, Path]:
    """`index` with its state/action statistics replaced by the checkpoint's (those `norm` needs
    must be there, at the dataset's sizes); the file they came from."""
    stats, source = read_checkpoint_stats(folder)
    sizes = {"state": len(index.state_names), "action": len(index.action_names)}
    merged = {}
    for part, size in sizes.items():
        have = stats.get(part, {})
        for name in NEEDED[norm]:
            if name not in have:
                raise CheckpointError(str(source), f"no {part} {name} (data.norm = {norm!r} needs {NEEDED[norm]})")
            if len(have[name]) != size:
                raise CheckpointError(str(source), f"{part} {name} has {len(have[name])} values; the dataset's "
                                      f"{part} has {size}")
        merged[part] = {**index.stats[part], **{k: v for k, v in have.items() if len(v) == size}}
    return dataclasses.replace(index, stats={**index.stats, **merged}), source


def stats_files(stats: Stats, fmt: str, norm: str) -> dict[str, bytes]:
    """The files an export carries its statistics in (`norm`: the run's data.norm): LeRobot's
    normalizer / unnormalizer steps, or openpi's `assets/trainkit/norm_stats.json` (the other
    processor steps, tokenizer and device, are not written)."""
    if fmt == "openpi":
        keep = ("mean", "std", "q01", "q99")
        body = {"norm_stats": {"state": {k: v for k, v in stats["state"].items() if k in keep},
                               "actions": {k: v for k, v in stats["action"].items() if k in keep}}}
        return {"assets/trainkit/norm_stats.json": (json.dumps(body, indent=1) + "\n").encode()}
    import torch
    from safetensors.torch import save

    tensors = {f"{_LEROBOT_KEYS[part]}.{name}": torch.tensor(values, dtype=torch.float32)
               for part, d in stats.items() if part in _LEROBOT_KEYS for name, values in d.items()}
    features = {_LEROBOT_KEYS[p]: {"type": "STATE" if p == "state" else "ACTION", "shape": [len(stats[p]["mean"])]}
                for p in _LEROBOT_KEYS if stats.get(p, {}).get("mean")}
    mode = LEROBOT_MODE[norm]
    files = {}
    for name, registry, pipeline in (("policy_preprocessor", "normalizer_processor", PREPROCESSOR),
                                     ("policy_postprocessor", "unnormalizer_processor", POSTPROCESSOR)):
        state_file = f"{name}_step_0_{registry}.safetensors"
        config = {"eps": 1e-8, "features": features,
                  "norm_map": {"STATE": mode, "ACTION": mode, "VISUAL": "IDENTITY"}}
        body = {"name": name, "steps": [{"registry_name": registry, "config": config, "state_file": state_file}]}
        files[pipeline] = (json.dumps(body, indent=2) + "\n").encode()
        files[state_file] = save(tensors)
    return files

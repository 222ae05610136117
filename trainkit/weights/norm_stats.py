"""Normalisation statistics a checkpoint was trained with: read for `data.norm_from = "checkpoint"`,
written with every `trainkit export`.

A fine-tune must normalise state and actions as the checkpoint's training did, or with its own
dataset's statistics (`data.norm_from = "dataset"`, the default: the shard index's). Formats:
- LeRobot: `policy_preprocessor.json`, whose `normalizer_processor` step names a safetensors file
  of `observation.state.<stat>` and `action.<stat>` tensors (mean, std, min, max, q01, q99);
- openpi: `assets/<asset id>/norm_stats.json`, `{"norm_stats": {"state": {...}, "actions": {...}}}`
  (mean, std, q01, q99).
The statistics replace the index's in the run's `ShardIndex` (`with_weights_stats`), so the
loader, the host normaliser and the prompt's state bins all use them; the robot's state and action
sizes must match the dataset's. A resumed run reads them again from `model.init_from`.

What is refused, in one line naming the file and the key (`stats_problem`; the dataset's own
statistics, `data.norm_from = "dataset"`, pass the same rule, `check_dataset_stats`):
- a value that is not finite (any statistic the file holds, used or not: the file is damaged);
- a negative std, q99 below q01, max below min;
- a zero range (std 0, or q01 == q99) where the data the run normalises is not that one value:
  the normaliser floors the range at 1e-8 (as LeRobot's does), so those values are multiplied by
  1e8 and the loss reaches 1e15 (all-zero statistics did exactly that). A constant dimension is
  accepted: real datasets have them (a gripper never used), and LeRobot and datakit map its one
  value to 0 (or -1) through the same floor. A dimension whose q01 == q99 but whose values still
  span [min, max] (it moves in under 1% of frames) is refused under quantile normalisation.
Dims (`check_robot_dims`, `with_weights_stats`): the dataset's state / action channels must be
at most the model's (`Family.robot_dims`), and every statistic a checkpoint holds for them must
have the dataset's channels; a dataset's own statistics are held to its channels by datakit's
index check.
The files a checkpoint names (LeRobot's `state_file`; openpi's `assets/*/norm_stats.json`) must
resolve inside the checkpoint folder: no absolute path, no `..`, no symlink out, so a checkpoint
cannot make the run read another file. The one exception is huggingface_hub's cache, whose
`snapshots/<revision>/` files are symlinks into the repository's own `blobs/` folder.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from datakit.shards.index import ShardIndex
from trainkit.errors import CheckpointError, DataError
from trainkit.weights.lerobot_processors import LEROBOT_KEYS, Stats, statistics_only
from trainkit.weights.publish import check_export_folder
from trainkit.weights.safetensors_file import load_checked

KeyName = Callable[[str, str], str]  # (part, stat) -> how the file names it, for error lines
PREPROCESSOR, POSTPROCESSOR = "policy_preprocessor.json", "policy_postprocessor.json"
NEEDED = {"quantile": ("q01", "q99"), "mean_std": ("mean", "std"), "none": ()}
_OPENPI_KEYS = {"state": "state", "action": "actions"}
LEROBOT_MODE = {"quantile": "QUANTILES", "mean_std": "MEAN_STD", "none": "IDENTITY"}  # data.norm -> LeRobot's
EPS = 1e-8  # the floor datakit's normaliser (and LeRobot's) puts under a zero range
OPENPI_STATS = "assets/trainkit/norm_stats.json"  # an export's, in openpi's assets/<asset id>/ layout


@dataclasses.dataclass(frozen=True)
class _Found:
    """A checkpoint's statistics and where they came from."""

    stats: Stats
    source: Path  # the file the log line names: policy_preprocessor.json, or norm_stats.json
    values: Path  # the file that holds the numbers: the normalizer's state_file, or norm_stats.json
    key: KeyName  # how `values` names each statistic


def read_weights_stats(folder: str | Path) -> tuple[Stats, Path]:
    """(statistics, the file they came from) of a weights folder; CheckpointError if it has none."""
    found = _find(Path(folder))
    return found.stats, found.source


def _find(folder: Path) -> _Found:
    check_export_folder(folder)  # an unfinished or incomplete trainkit export (publish.py)
    pre = folder / PREPROCESSOR
    if pre.is_file():
        return _read_lerobot(folder, pre)
    found = sorted(folder.glob("assets/*/norm_stats.json"))
    if found:
        return _read_openpi(folder, found[0])
    raise CheckpointError(str(folder), f"data.norm_from = 'checkpoint': no {PREPROCESSOR} (LeRobot) or "
                          "assets/*/norm_stats.json (openpi) in model.init_from")


def inside_weights_folder(folder: Path, name: str, named_in: Path, what: str) -> Path:
    """`folder / name`, refused (naming `named_in`, the file that names it) unless it stays in `folder`
    (resolved: a symlink out is refused, but a Hugging Face cache snapshot's links into its `blobs/`)."""
    rel = PurePosixPath(name)
    if rel.is_absolute():
        why = "an absolute path"
    elif ".." in rel.parts:
        why = "it climbs out with '..'"
    elif not _resolves_inside(folder, folder / name):
        why = f"it resolves to {(folder / name).resolve()}"
    else:
        return folder / name
    raise CheckpointError(str(named_in), f"{what} {name!r} is outside the checkpoint folder ({why}); refused: "
                          "a checkpoint may name only its own files")


def _resolves_inside(folder: Path, path: Path) -> bool:
    root = folder.resolve()
    roots = [root, root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [root]  # huggingface_hub
    real = path.resolve()
    return any(real.is_relative_to(r) for r in roots)


def _lists(d: dict[str, Any]) -> dict[str, list[float]]:
    return {k: [float(x) for x in v] for k, v in d.items() if isinstance(v, list)}


def _read_openpi(folder: Path, path: Path) -> _Found:
    path = inside_weights_folder(folder, path.relative_to(folder).as_posix(), folder, "statistics file")
    try:
        raw = json.loads(path.read_text())["norm_stats"]
        stats = {"state": _lists(raw["state"]), "action": _lists(raw["actions"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(str(path), f"not openpi norm stats ({type(e).__name__}: {e})") from None
    return _Found(stats, path, path, lambda part, name: f"norm_stats.{_OPENPI_KEYS[part]}.{name}")


def _read_lerobot(folder: Path, path: Path) -> _Found:
    try:
        steps = json.loads(path.read_text())["steps"]
        step = next(s for s in steps if s.get("registry_name") == "normalizer_processor" and s.get("state_file"))
    except StopIteration:
        raise CheckpointError(str(path), "has no normalizer_processor step with a state_file") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(str(path), f"unreadable LeRobot processor ({type(e).__name__}: {e})") from None
    if not isinstance(step["state_file"], str):
        raise CheckpointError(str(path), f"state_file {step['state_file']!r} is not a file name")
    values = inside_weights_folder(folder, step["state_file"], path, "state_file")
    out: Stats = {"state": {}, "action": {}}
    for key, tensor in load_checked(values).items():
        feature, _, stat = key.rpartition(".")
        for ours, theirs in LEROBOT_KEYS.items():
            if feature == theirs:
                out[ours][stat] = tensor.flatten().double().tolist()
    return _Found(out, path, values, lambda part, name: f"{LEROBOT_KEYS[part]}.{name}")


def stats_problem(stats: Stats, data: Stats, norm: str, key: KeyName) -> str | None:
    """The first thing wrong with `stats` for normalising data whose per-dimension range is
    `data`'s min and max under `norm` (the rule in the module docstring), or None."""
    for part in [p for p in ("state", "action") if p in stats]:
        per = stats[part]
        problem = _values_problem(part, per, key) or _range_problem(part, per, data[part], norm, key)
        if problem:
            return problem
    return None


def _values_problem(part: str, per: dict[str, list[float]], key: KeyName) -> str | None:
    for name, values in per.items():
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:
            return f"{key(part, name)}[{bad}] is {values[bad]}: statistics must be finite"
    bad = next((i for i, v in enumerate(per.get("std", ())) if v < 0), None)
    if bad is not None:
        return f"{key(part, 'std')}[{bad}] is {per['std'][bad]:g}: negative (a standard deviation is >= 0)"
    for lo, hi in (("q01", "q99"), ("min", "max")):
        pairs = list(zip(per.get(lo, ()), per.get(hi, ())))
        bad = next((i for i, (a, b) in enumerate(pairs) if b < a), None)
        if bad is not None:
            return (f"{key(part, hi)}[{bad}] = {pairs[bad][1]:g} is below {key(part, lo)}[{bad}] = "
                    f"{pairs[bad][0]:g}")
    return None


def _range_problem(part: str, per: dict[str, list[float]], data: dict[str, list[float]], norm: str,
                   key: KeyName) -> str | None:
    """A zero range (std 0, or q01 == q99) over data that is not its one value: scaled by 1/EPS."""
    if any(name not in per for name in NEEDED[norm]):  # the callers refuse that first, naming what is missing
        return None
    if norm == "quantile":
        width = [b - a for a, b in zip(per["q01"], per["q99"])]
        value, name = per["q01"], lambda i: f"{key(part, 'q01')}[{i}] == {key(part, 'q99')}[{i}] = {value[i]:g}"
    elif norm == "mean_std":
        width, value, name = per["std"], per["mean"], lambda i: f"{key(part, 'std')}[{i}] is 0"
    else:
        return None
    zero = [i for i, w in enumerate(width) if w == 0]
    for i in zero:
        lo, hi = data["min"][i], data["max"][i]
        if not all(math.isclose(x, value[i], rel_tol=1e-9, abs_tol=1e-12) for x in (lo, hi)):
            every = f" (in every {part} dimension)" if len(zero) == len(width) else ""
            return (f"{name(i)}: a zero range{every}, while the {part} values there span [{lo:g}, {hi:g}]: "
                    f"normalising would divide by {EPS:g} (a loss near 1e16)")
    return None


def check_robot_dims(index: ShardIndex, robot_dims: Mapping[str, str], model_cfg: Any, shards: str,
                     from_weights: Collection[str] = ()) -> None:
    """Refuse a dataset whose state or action has more channels than the model takes
    (`Family.robot_dims`: the config field bounding each; the robot's are zero-padded up to it,
    and a longer one would fail in the first batch, after the model is built), naming its
    index.json and the key; `from_weights`: the fields model.init_from's checkpoint set."""
    for part, field in robot_dims.items():
        have, most = len(getattr(index, f"{part}_names")), getattr(model_cfg, field)
        if have > most:
            whose = " from model.init_from's checkpoint" if field in from_weights else ""
            raise DataError(f"{shards.rstrip('/')}/index.json", f"{part}_names has {have} channels; the model takes "
                            f"at most {most} (model.{field}{whose})")


def check_dataset_stats(index: ShardIndex, norm: str, shards: str) -> None:
    """Refuse the dataset's own statistics (`data.norm_from = "dataset"`) under the rule above,
    naming `shards`' index.json and the key."""
    problem = stats_problem(index.stats, index.stats, norm, lambda part, name: f"stats.{part}.{name}")
    if problem:
        raise DataError(f"{shards.rstrip('/')}/index.json", problem)


def with_weights_stats(index: ShardIndex, folder: str | Path, norm: str) -> tuple[ShardIndex, Path]:
    """`index` with its state/action statistics replaced by the weights folder's (those `norm` needs
    must be there, at the dataset's sizes, and pass `stats_problem` against the dataset's range);
    the file they came from."""
    found = _find(Path(folder))
    sizes = {"state": len(index.state_names), "action": len(index.action_names)}
    used: Stats = {}
    for part, size in sizes.items():
        have = found.stats.get(part, {})
        for name in NEEDED[norm]:
            if name not in have:
                raise CheckpointError(str(found.source), f"no {part} {name} (data.norm = {norm!r} needs "
                                      f"{NEEDED[norm]})")
        for name, values in have.items():  # every statistic the file holds: one of another size is damage
            if len(values) != size:
                raise CheckpointError(str(found.values), f"{found.key(part, name)} has {len(values)} values; the "
                                      f"dataset's {part} has {size} ({part}_names of its index.json)")
        used[part] = have
    problem = stats_problem(used, index.stats, norm, found.key)
    if problem:
        raise CheckpointError(str(found.values), problem)
    merged = {part: {**index.stats[part], **used[part]} for part in sizes}
    return dataclasses.replace(index, stats={**index.stats, **merged}), found.source


def stats_files(stats: Stats, fmt: str, norm: str) -> dict[str, bytes]:
    """The files a folder carries its statistics in (`norm`: the run's data.norm): openpi's
    `assets/trainkit/norm_stats.json`, or LeRobot's normalizer / unnormalizer steps alone (`trainkit
    export --format lerobot` writes LeRobot's whole pipeline with them: lerobot_processors.py)."""
    if fmt == "openpi":
        keep = ("mean", "std", "q01", "q99")
        body = {"norm_stats": {"state": {k: v for k, v in stats["state"].items() if k in keep},
                               "actions": {k: v for k, v in stats["action"].items() if k in keep}}}
        return {OPENPI_STATS: (json.dumps(body, indent=1) + "\n").encode()}
    return statistics_only(stats, LEROBOT_MODE[norm])

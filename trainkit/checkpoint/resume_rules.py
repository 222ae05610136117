"""What a resumed run may change, in one place, and the dataset identity it is checked against.

A checkpoint's manifest records the run that wrote it (`RunRecord`: its config, its dataset's
identity, its global batch). On resume the current run is compared with it, key by key:

- Refused, in one line naming the key: another dataset, another model (`model.*`), seed
  (`train.seed`), global batch, image slots, normalisation or sample order (`data.slots`,
  `data.norm`, `data.shuffle`, the validation holdout `data.val_*`, a mixture's `data.fps` and its
  sources' weights, slots and prompts `data.sources[i].*`). They decide what the restored
  weights, Adam moments and sampler position mean; going on under others would be a different run
  started from a state not its own. The dataset is compared by identity, not path: the `sha256`
  entries of its `checksums.json` (index.json and frames.arrow, and through the index every shard's
  hash), so a moved or downloaded copy is the same dataset and a re-conversion of other data with
  the same frame count is not; a mixture's identity is its sources', in order.
- Applied from the resumed step on, and said in one line: the optimiser and its schedule
  (`optim.*`), `train.steps` (the schedule's length), `train.grad_clip`, `train.on_nonfinite`,
  `train.ema_decay` (an average the checkpoint lacks starts at the resumed weights).
  Lowering the lr after a loss spike or extending a run is a legitimate thing to want; the Adam
  moments and step count are restored, the hyperparameters always come from the config.
- Free, not mentioned: what changes how, not what, is computed: `parallel.*`, `output.*`, the
  loader's plumbing (`data.num_workers`, `prefetch_factor`, `gil_switch_ms`, `h2d_dtype`, `prune_slots`, the cache,
  the path in `data.shards` or `data.sources[i].shards`, a source's `name`), `train.micro_batch` and the world size
  (the global batch is what counts; see dcp.py), `train.memory_cap_gib`.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datakit.shards.names import CHECKSUMS_NAME
from trainkit.config import RunConfig, SourceConfig
from trainkit.errors import CheckpointError, DataError

REFUSED = ("model.", "train.seed", "data.slots", "data.norm", "data.shuffle", "data.val_", "data.fps", "data.sources")
APPLIED = ("optim.", "train.steps", "train.grad_clip", "train.on_nonfinite", "train.ema_decay")
# a mixture source's path (its identity is its checksums.json, as for data.shards) and name (its metrics')
FREE = ("].shards", "].name")
# the way out of every refused resume (output.resume=false would leave the old checkpoints beside
# the new run's, for a later resume to pick up)
START_OVER = "use another output.dir (or move its checkpoints/ away) to start a new run"


@dataclass
class RunRecord:
    """What a checkpoint records about the run that wrote it."""

    config: dict[str, Any]  # RunConfig.to_dict()
    dataset: dict[str, Any]  # dataset_identity()
    global_batch: int


def recorded_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (RunConfig.to_dict()) as a checkpoint records it: data.shards resolved to an absolute
    path (a URL as it is), so a reader in another directory (`trainkit export`) finds the dataset's
    statistics. The path is free on resume, so a manifest with a relative one still resumes."""
    data = config["data"]
    sources = [{**s, "shards": _absolute(s["shards"])} for s in data.get("sources", [])]
    return {**config, "data": {**data, "shards": _absolute(data["shards"]), "sources": sources}}


def _absolute(shards: str) -> str:
    return shards if not shards or "://" in shards else str(Path(shards).resolve())


def dataset_identity(index_folder: Path) -> dict[str, Any]:
    """The dataset's identity: the sha256 entries of its checksums.json (written last by datakit)."""
    path = Path(index_folder) / CHECKSUMS_NAME
    try:
        sums = json.loads(path.read_bytes())["sha256"]
        if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise DataError(str(path), "unreadable: not a finished datakit shard folder") from None
    return {"sha256": dict(sorted(sums.items()))}


def _defaults() -> dict[str, Any]:
    """Every config key's default value, flattened as `_flat` flattens a config."""
    sections = typing.get_type_hints(RunConfig)
    return _flat({name: {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                         for f in dataclasses.fields(sections[name])} for name in sections})


def _source_defaults() -> dict[str, Any]:
    """A [[data.sources]] table's default values (shards and weight have none that matter)."""
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(SourceConfig)}


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif k == "sources" and isinstance(v, list):  # data.sources[i].weight, ...: each key on its own
            for i, source in enumerate(v):  # a key the source's trainkit lacked (val_episodes): its default
                out.update(_flat({**_source_defaults(), **source}, f"{prefix}{k}[{i}]."))
        else:
            out[prefix + k] = v
    return out


def resume_changes(where: Path, saved: RunRecord, saved_world: int, now: RunRecord, world: int) -> list[str]:
    """The applied changes ("optim.lr 0.003 -> 0.001", ...) of resuming checkpoint `where` with
    this run; CheckpointError, one line, for a refused one (the first found is named)."""
    if saved.dataset != now.dataset:
        shards = now.config["data"]["shards"] or ", ".join(s["shards"] for s in now.config["data"]["sources"])
        raise CheckpointError(str(where), f"written for another dataset than data.shards {shards} "
                              f"(their checksums.json differ); resume with the checkpoint's dataset, or {START_OVER}")
    if saved.global_batch != now.global_batch:
        raise CheckpointError(str(where), f"written by {saved_world} ranks with global batch {saved.global_batch}, "
                              f"this run has {world} ranks and global batch {now.global_batch}; a resume needs the "
                              f"same train.global_batch (world size and micro_batch may change), or {START_OVER}")
    # a key the checkpoint's trainkit lacked (data.fps before mixtures) had its default value then
    defaults = _defaults()
    old, new = {**defaults, **_flat(saved.config)}, {**defaults, **_flat(now.config)}
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    refused = [k for k in changed if k.startswith(REFUSED) and not k.endswith(FREE)]
    if refused:
        k = refused[0]
        more = f" (and {', '.join(refused[1:])})" if len(refused) > 1 else ""
        raise CheckpointError(str(where), f"written with {k}={old.get(k)!r}, this run has {k}={new.get(k)!r}{more}; "
                              f"a resume keeps the model, seed, batch and data settings: use the checkpoint's, "
                              f"or {START_OVER}")
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed if k.startswith(APPLIED)]

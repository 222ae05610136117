"""What a run asks of the data plan: the LoaderConfig its family's loader preset builds for rank 0
(frame offsets, action horizon, slots, batch size per rank, image dtype, ...), and the `datakit
plan` line that says what storage, the shard cache and the bus must give for it. `trainkit
inspect` prints it (`--json`: the "loader" key; `--loader-toml FILE` writes the LoaderConfig).

    needs, loader = loader_needs(cfg, world_size=8)          # JSON-able dict, datakit LoaderConfig
    Path("loader.toml").write_text(loader_toml(cfg, needs, loader))
    # datakit plan SHARDS --loader-config loader.toml --samples-per-s N --ranks 8

Built as the trainer builds it (`trainkit.data.loader_settings`, then the family's
`loader_config`), from the shard index when `data.shards` is a finished local shard folder. Without
one (unset, not there yet, or a URL: inspect downloads nothing) the preset gets no index, and the
fields that the index decides are listed in `depends_on_data`: `slots` (data.slots empty: one slot
per index camera, which the loader then resolves), `resize` (the run drops it when every camera's
frames are stored at the model's size) and `episodes` (a validation holdout picks them from the index).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from datakit.errors import DatakitError
from datakit.loader import LoaderConfig, loader_config_to_toml
from datakit.shards.index import ShardIndex, is_finished, load_index
from datakit.storage.urls import is_remote
from trainkit.data import loader_settings
from trainkit.errors import DataError, ModelConfigError
from trainkit.models import build_config, family
from trainkit.parallel import compute_dtype
from trainkit.validation import holdout


def _index(shards: str) -> ShardIndex | None:
    """The index of a finished local shard folder; None for no folder (or a URL)."""
    if not shards or is_remote(shards) or not is_finished(Path(shards)):
        return None
    return load_index(Path(shards))


def loader_needs(cfg: Any, world_size: int = 1, samples_per_s: float | None = None,
                 toml_path: str | None = None) -> tuple[dict[str, Any], LoaderConfig | None]:
    """(the report, the LoaderConfig of rank 0) for a RunConfig at `world_size`; the report holds
    `error` (and the config is None) where the preset cannot be built: a bad index, or what a
    family needs from the data and the config does not say (dreamzero's slots without an index)."""
    dcfg, train = cfg.data, cfg.train
    micro = train.micro_batch
    accum = max(1, (train.global_batch or micro * world_size) // (micro * world_size))
    plan = plan_command(dcfg.shards or "SHARDS", toml_path or "LOADER.toml", samples_per_s, world_size)
    try:
        index = _index(dcfg.shards)
        slots = tuple(s or None for s in dcfg.slots) or (tuple(index.cameras) if index is not None else ())
        episodes = holdout(dcfg, index).train if index is not None else None
        loader = family(cfg.model.family).loader_config(
            build_config(cfg.model.family, cfg.model.preset, cfg.model.overrides), index,
            **loader_settings(dcfg, slots, seed=train.seed, rank=0, world_size=world_size, micro_batch=micro,
                              global_batch=micro * world_size * accum, episodes=episodes,
                              image_dtype=compute_dtype(cfg.parallel), pin_memory=True))
    except (DatakitError, DataError, ModelConfigError, ValueError, OSError) as e:
        return {"error": str(e), "plan": plan}, None
    depends = [] if index is not None else (
        (["slots"] if not dcfg.slots else []) + (["resize"] if loader.resize is not None else [])
        + (["episodes"] if dcfg.val_episodes or dcfg.val_fraction else []))
    return {"config": dataclasses.asdict(loader), "index": dcfg.shards if index is not None else None,
            "depends_on_data": depends, "plan": plan}, loader


def plan_command(shards: str, toml_path: str, samples_per_s: float | None, world_size: int) -> str:
    """The `datakit plan` line of a run ("N" where no target samples/s was given)."""
    target = "N" if samples_per_s is None else f"{samples_per_s:g}"
    return f"datakit plan {shards} --loader-config {toml_path} --samples-per-s {target} --ranks {world_size}"


def loader_toml(cfg: Any, needs: dict[str, Any], loader: LoaderConfig) -> str:
    """The LoaderConfig as TOML (`datakit plan --loader-config`), with where it came from on top."""
    note = [f"The LoaderConfig of rank 0 of `trainkit run` with model {cfg.model.family}/{cfg.model.preset}, "
            f"as its loader preset builds it ({loader.world_size} rank(s)); written by `trainkit inspect`.",
            needs["plan"]]
    if needs["depends_on_data"]:
        note.append("Built without the shard index: the data decides " + ", ".join(needs["depends_on_data"]) + ".")
    return loader_config_to_toml(loader, "\n".join(note))


def format_loader(needs: dict[str, Any]) -> list[str]:
    """Lines of `trainkit inspect`'s loader section."""
    if "error" in needs:
        return [f"loader: cannot build the run's LoaderConfig: {needs['error']}"]
    c = needs["config"]
    slots = ", ".join(s or "(empty)" for s in c["slots"]) if c["slots"] else "one per index camera"
    epoch_batch = c["epoch_batch"] or c["batch_size"] * c["world_size"]
    shape = [f"frame_offsets {_offsets(c['frame_offsets'])}", f"state_offsets {_offsets(c['state_offsets'])}",
             f"action_horizon {c['action_horizon']}",
             f"slots [{slots}]" + (" pruned per batch" if c["prune_slots"] else ""),
             f"batch_size {c['batch_size']} per rank (epoch_batch {epoch_batch})", f"image_dtype {c['image_dtype']}"]
    if c["resize"] is not None:
        shape.append(f"resize {c['resize'][0]}x{c['resize'][1]} {c['resize_mode']}")
    if c["tile"] is not None:
        shape.append(f"tile {c['tile']}")
    shape += [f"norm {c['norm']}", f"shuffle {c['shuffle']}", f"num_workers {c['num_workers']}"]
    where = (f"from the index of {needs['index']}" if needs["index"] is not None else
             "without the shard index (data.shards unset or not a finished local shard folder)"
             + ("; the data decides " + ", ".join(needs["depends_on_data"]) if needs["depends_on_data"] else ""))
    return [f"loader (rank 0 of {c['world_size']}, {where}):", "  " + ", ".join(shape),
            f"  {needs['plan']}"]


def _offsets(offsets: list[int] | tuple[int, ...]) -> str:
    """(0,) -> '0'; a long run of consecutive offsets -> '-32..0 (33)'."""
    o = list(offsets)
    if len(o) > 3 and o == list(range(o[0], o[-1] + 1)):
        return f"{o[0]}..{o[-1]} ({len(o)})"
    return ",".join(str(x) for x in o)

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
frames are stored at the model's size, unless a crop is resized back to it) and `episodes` (a
validation holdout picks them from the index).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from datakit.errors import DatakitError
from datakit.loader import LoaderConfig, loader_config_to_toml
from datakit.shards.features import is_feature_folder, load_features
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
    plan = plan_command(dcfg, toml_path or "LOADER.toml", samples_per_s, world_size)
    if dcfg.shards and not is_remote(dcfg.shards) and is_feature_folder(Path(dcfg.shards)):
        return feature_needs(dcfg.shards, micro, world_size, samples_per_s), None
    first = dcfg.sources[0] if dcfg.sources else None  # a mixture: the loader preset sees its first source
    try:
        index = _index(first.shards if first else dcfg.shards)
        slots = tuple(s or None for s in (first.slots if first and first.slots else dcfg.slots)) or \
            (tuple(index.cameras) if index is not None else ())
        episodes = holdout(dcfg, index, first).train if index is not None else None  # a mixture: its first source's
        loader = family(cfg.model.family).loader_config(
            build_config(cfg.model.family, cfg.model.preset, cfg.model.overrides), index,
            **loader_settings(dcfg, slots, seed=train.seed, rank=0, world_size=world_size, micro_batch=micro,
                              global_batch=micro * world_size * accum, episodes=episodes,
                              image_dtype=compute_dtype(cfg.parallel), pin_memory=True),
            **({"fps": dcfg.fps} if dcfg.sources else {}))  # a mixture's window rate, as TrainData sets it
    except (DatakitError, DataError, ModelConfigError, ValueError, OSError) as e:
        return {"error": str(e), "plan": plan}, None
    depends = [] if index is not None else (
        (["slots"] if not dcfg.slots else [])
        + (["resize"] if loader.resize is not None and not loader.crop_resize else [])  # a crop resized back keeps it
        + (["episodes"] if dcfg.holds_out else []))
    needs = {"config": dataclasses.asdict(loader), "index": (first.shards if first else dcfg.shards)
             if index is not None else None, "depends_on_data": depends, "plan": plan}
    if dcfg.sources:
        needs["mixture"] = mixture_needs(dcfg, loader, samples_per_s, world_size)
    return needs, loader


def feature_needs(folder: str, micro_batch: int, world_size: int, samples_per_s: float | None) -> dict[str, Any]:
    """What a run on a feature folder (`datakit encode`, `trainkit encode-backbone`) reads: its clips,
    fields and bytes per sample, and at `samples_per_s` the read rate per node (no LoaderConfig: the
    feature loader reads whole samples by offset, no frames, no resize). {"error": ...} for a folder
    whose index does not load."""
    try:
        index = load_features(Path(folder))
    except (DatakitError, ValueError, OSError) as e:
        return {"error": f"{folder}: {e}"}
    fields = {name: {"dtype": f.dtype, "shape": list(f.shape), "bytes": f.bytes} for name, f in index.fields.items()}
    per = sum(f["bytes"] for f in fields.values()) + 4 * (len(index.state_names) + index.span * len(index.action_names))
    return {"features": folder, "kind": index.fingerprint.get("kind", "clips"), "clips": index.num_clips,
            "fields": fields, "bytes_per_sample": per, "batch_size": micro_batch, "world_size": world_size,
            "read_bytes_per_s": per * samples_per_s if samples_per_s else None}


def plan_command(dcfg: Any, toml_path: str, samples_per_s: float | None, world_size: int) -> str:
    """The `datakit plan` line of a run ("N" where no target samples/s was given); a mixture's names
    every source with `--weights`."""
    target = "N" if samples_per_s is None else f"{samples_per_s:g}"
    shards = " ".join(dcfg.roots) or "SHARDS"
    weights = f" --weights {','.join(f'{s.weight:g}' for s in dcfg.sources)}" if dcfg.sources else ""
    return f"datakit plan {shards}{weights} --loader-config {toml_path} --samples-per-s {target} --ranks {world_size}"


def mixture_needs(dcfg: Any, loader: LoaderConfig, samples_per_s: float | None, world_size: int) -> dict[str, Any]:
    """What a mixture asks of storage and cache (datakit's `mixture_plan`, the one rule `datakit plan`
    prints): bytes per sample (share-weighted), the cache working set per node of each source and
    of all (every source walks its own epochs at once), read and host-to-device rates at the target
    (`samples_per_s`; without one, 1 sample/s: the rates are then per sample/s). Each source with its
    own slots (the source's, else data.slots, else its cameras), as the trainer resolves them. The
    ceiling is measured on the mixture's loader (`measure`: the `datakit plan ... --measure` line,
    None where the sources map their cameras apart, which that command cannot say);
    inspect reads no shard. {"error": ...} where a source is not a finished local folder."""
    from datakit.loader.throughput.mixture import mixture_plan
    from trainkit.config import loader_sources

    sources = []
    for src in loader_sources(dcfg):
        index = _index(src.root)
        if index is None:
            return {"error": f"{src.root}: not a finished local shard folder (inspect downloads nothing)"}
        slots = src.slots or tuple(s or None for s in dcfg.slots) or tuple(index.cameras)
        sources.append(dataclasses.replace(src, slots=slots))
    try:
        plan = mixture_plan(sources, loader, samples_per_s=samples_per_s or 1.0, ranks=world_size)
    except (DatakitError, ValueError, OSError) as e:  # e.g. a source with fewer samples than a global batch
        return {"error": str(e)}
    return {"samples_per_s": samples_per_s, "bytes_per_sample": plan.bytes_per_sample,
            "image_bytes_per_sample": plan.image_bytes_per_sample, "dataset_bytes": plan.dataset_bytes,
            "working_set_bytes_per_node": plan.working_set_bytes_per_node,
            "read_bytes_per_s_per_node": plan.read_bytes_per_s_per_node,
            "h2d_bytes_per_s_uint8": plan.h2d_bytes_per_s_uint8,
            "sources": [{"name": p.name, "root": p.root, "weight": p.weight, "samples": p.plan.num_anchors,
                         "bytes_per_sample": p.plan.bytes_per_sample,
                         "working_set_bytes_per_node": p.plan.working_set_bytes_per_node,
                         "epoch_seconds": p.source_epoch_seconds if samples_per_s else None} for p in plan.sources],
            # `datakit plan` maps every source's cameras by the one loader config: sources with their
            # own slot maps have no command line to measure with (None)
            "measure": plan_command(dcfg, "LOADER.toml", samples_per_s, world_size) + " --measure"
            if all(s.slots == tuple(loader.slots) for s in sources) else None}


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
    if "features" in needs:
        fields = ", ".join(f"{k} {f['dtype']} {'x'.join(map(str, f['shape']))}" for k, f in needs["fields"].items())
        rate = (f"; {needs['read_bytes_per_s'] / 2**20:.1f} MiB/s read at the target" if needs["read_bytes_per_s"]
                else "")
        return [f"loader (rank 0 of {needs['world_size']}, the feature folder {needs['features']}: "
                f"{needs['clips']} samples, {needs['kind']}):",
                f"  {fields}; {needs['bytes_per_sample'] / 2**10:.1f} KiB a sample, batch_size {needs['batch_size']} "
                f"per rank{rate}"]
    c = needs["config"]
    slots = ", ".join(s or "(empty)" for s in c["slots"]) if c["slots"] else "one per index camera"
    epoch_batch = c["epoch_batch"] or c["batch_size"] * c["world_size"]
    shape = [f"frame_offsets {_offsets(c['frame_offsets'])}", f"state_offsets {_offsets(c['state_offsets'])}",
             f"action_horizon {c['action_horizon']}",
             f"slots [{slots}]" + (" pruned per batch" if c["prune_slots"] else ""),
             f"batch_size {c['batch_size']} per rank (epoch_batch {epoch_batch})", f"image_dtype {c['image_dtype']}"]
    if c["resize"] is not None:
        shape.append(f"resize {c['resize'][0]}x{c['resize'][1]} {c['resize_mode']}")
    if c["crop"] is not None:
        where = ("centre" if not c["random_crop"] else
                 "at a random place per sample" if c["crop_per_sample"] else "at a random place per batch")
        back = f", back to {c['resize'][0]}x{c['resize'][1]}" if c["crop_resize"] else ""
        shape.append(f"crop {c['crop'][0]}x{c['crop'][1]} {where}{back}")
    if c["tile"] is not None:
        shape.append(f"tile {c['tile']}")
    shape += [f"norm {c['norm']}", f"shuffle {c['shuffle']}", f"num_workers {c['num_workers']}"]
    first = " (the mixture's first source)" if "mixture" in needs else ""
    where = (f"from the index of {needs['index']}{first}" if needs["index"] is not None else
             "without the shard index (data.shards unset or not a finished local shard folder)"
             + ("; the data decides " + ", ".join(needs["depends_on_data"]) if needs["depends_on_data"] else ""))
    return [f"loader (rank 0 of {c['world_size']}, {where}):", "  " + ", ".join(shape),
            f"  {needs['plan']}"] + (format_mixture(needs["mixture"]) if "mixture" in needs else [])


def format_mixture(m: dict[str, Any]) -> list[str]:
    """Lines of the mixture's storage needs (`mixture_needs`)."""
    if "error" in m:
        return [f"mixture: no storage plan: {m['error']}"]
    at = f" at {m['samples_per_s']:g} samples/s" if m["samples_per_s"] else " per sample/s (--samples-per-s N)"
    lines = [f"mixture: {_mib(m['bytes_per_sample'])} per sample (share-weighted, images "
             f"{_mib(m['image_bytes_per_sample'])}), cache working set per node "
             f"{_mib(m['working_set_bytes_per_node'])} (every source's own epoch at once), reads {_mib(m['read_bytes_per_s_per_node'])}/s per node{at}"]
    for s in m["sources"]:
        every = f", one pass every {s['epoch_seconds']:.1f} s" if s["epoch_seconds"] else ""
        lines.append(f"  source {s['name']} ({s['weight']:.1%}): {s['samples']} samples, {_mib(s['bytes_per_sample'])} "
                     f"per sample, working set per node {_mib(s['working_set_bytes_per_node'])}{every}")
    lines.append(f"  ceiling (reads the shards, times the mixture's loader): {m['measure']}" if m["measure"] else
                 "  ceiling: `datakit plan --measure` takes one slot map for every source; these sources map "
                 "their cameras apart")
    return lines


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _offsets(offsets: list[int] | tuple[int, ...]) -> str:
    """(0,) -> '0'; a long run of consecutive offsets -> '-32..0 (33)'."""
    o = list(offsets)
    if len(o) > 3 and o == list(range(o[0], o[-1] + 1)):
        return f"{o[0]}..{o[-1]} ({len(o)})"
    return ",".join(str(x) for x in o)

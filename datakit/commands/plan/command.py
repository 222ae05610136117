"""`datakit plan OUT --samples-per-s N [--ranks R]`: what a target throughput needs.

    datakit plan out/ --samples-per-s 3200 --ranks 16 --loader-config pi05.toml --batch-size 32
    datakit plan s3://bucket/droid --samples-per-s 3200 --ranks 64 --shuffle shard_block --cache-bytes 200GiB
    datakit plan out/ --samples-per-s 800 --measure --json
    datakit plan droid/ libero/ --weights 0.7,0.3 --samples-per-s 3200 --ranks 16   # a weighted mixture

Prints bytes per sample (what the loader reads: the slots it keeps, so a blank camera costs
nothing), read bandwidth per node, the epoch's working set per rank and node (the cache size
that downloads each shard once per epoch), host-to-device bytes per step (uint8 as the loader
sends it, and float32 for comparison). With --measure: this machine's disk and page-cache
bandwidth on the shards, the real loader's samples/s, the most samples/s these sustain for the
given ranks (`ceiling`), and where the GPUs would wait.

The sample shape comes from the shape flags, or from a LoaderConfig TOML (`--loader-config`,
what `trainkit inspect CONFIG --loader-toml FILE` writes for a training run: its frame offsets,
action horizon, slots, batch size per rank, ...), the flags given on top of the file; neither:
LoaderConfig's defaults (one frame per camera, one action).

Several folders make a mixture (`--weights`, default equal): each source is planned at its share
and the table adds a row per source (its bytes per sample, cache working set, one pass over it at its
share); the ceiling is measured on the mixture's own loader (datakit/loader/throughput/mixture.py says
how they combine).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from datakit.commands.flag_types import byte_size, non_negative_int, positive
from datakit.loader.config import LoaderConfig, loader_config_from_toml
from datakit.machine import available_cpus
from datakit.loader.throughput.ceiling import CACHE_SHARE, Ceiling, ceiling, working_set_fits
from datakit.loader.throughput.measure import Bandwidth, LoaderRate, measure_bandwidth, measure_loader, warm_page_cache
from datakit.loader.throughput.mixture import MixturePlan, index_copy, local_index, mixture_plan, named_as
from datakit.loader.throughput.features import plan_features
from datakit.loader.throughput.model import ThroughputPlan, plan_throughput
from datakit.shards.features import is_feature_folder
from datakit.loader.mixture import MixtureSource, mixture_sources
from datakit.shards.index import load_index
from datakit.storage.urls import is_remote, local_path


def _offsets(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _weights(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers") from None
    if not all(0 < w < float("inf") for w in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every weight must be a number > 0")
    return out


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="what a target samples/s needs: bandwidth, cache, host-to-device bytes",
                       description="Read an index (local folder or fsspec URL) and a loader config, and print what "
                                   "a target training throughput needs from storage, the shard cache and the bus.")
    p.add_argument("out", nargs="+", help="converted folder or URL (s3://..., gs://...); several: a mixture")
    p.add_argument("--weights", type=_weights, help="a mixture's weights, one per folder, e.g. 0.7,0.3 "
                                                    "(default: equal)")
    p.add_argument("--samples-per-s", type=positive(float), required=True,
                   help="target samples per second, all ranks together")
    p.add_argument("--ranks", type=positive(int), default=1, help="training ranks (GPUs) in all (default 1)")
    p.add_argument("--ranks-per-node", type=positive(int), default=8,
                   help="ranks per node sharing one cache (default 8)")
    p.add_argument("--loader-config", type=Path, metavar="FILE.toml",
                   help="a TOML of LoaderConfig fields (what `trainkit inspect --loader-toml` writes); "
                        "the flags below override it")
    p.add_argument("--batch-size", type=int, help="samples per rank per step (default: the file's, else 32)")
    p.add_argument("--frame-offsets", type=_offsets, help="frame offsets per camera, e.g. -8,-4,0")
    p.add_argument("--action-horizon", type=int, help="future actions per sample")
    p.add_argument("--slots", help="model image slots: comma list of cameras, 'none' for an empty slot")
    p.add_argument("--shuffle", choices=["random", "shard_block", "sequential"], help="sample order")
    p.add_argument("--block-size", type=int, help="anchors per block in shard_block order")
    p.add_argument("--boundary", choices=["pad", "skip"], help="episode ends: pad or skip")
    p.add_argument("--seed", type=int, help="the sampler's seed (default: the file's, else 0)")
    p.add_argument("--cache-bytes", type=byte_size,
                   help="simulate an LRU shard cache of this size per node, e.g. 200GiB")
    p.add_argument("--measure", action="store_true", help="measure this machine's disk and page-cache bandwidth and "
                                                          "the loader's samples/s on the shards, and print the ceiling "
                                                          "(local folders only)")
    p.add_argument("--measure-bytes", type=byte_size, default=1 << 30,
                   help="bytes read by --measure (default 1GiB)")
    p.add_argument("--measure-seconds", type=positive(float), default=3.0,
                   help="seconds the loader is timed (default 3)")
    p.add_argument("--workers", type=non_negative_int, help="loader worker processes per rank for --measure "
                                                       "(0: in this process; default: the file's num_workers, else "
                                                       "the cores this process may use)")
    p.add_argument("--h2d-gbps", type=positive(float),
                   help="host-to-device GB/s of one GPU, to say whether the bus waits")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def loader_config(args) -> LoaderConfig:
    """The --loader-config file (else LoaderConfig's defaults) with the flags that were given on top;
    the loader's workers for --measure: --workers, else the file's num_workers, else every core."""
    over = {"batch_size": args.batch_size, "frame_offsets": args.frame_offsets, "action_horizon": args.action_horizon,
            "shuffle": args.shuffle, "block_size": args.block_size, "boundary": args.boundary, "seed": args.seed,
            "num_workers": args.workers}
    if args.slots:
        over["slots"] = tuple(None if s.strip().lower() == "none" else s.strip() for s in args.slots.split(","))
    over = {k: v for k, v in over.items() if v is not None}
    defaults = {"num_workers": available_cpus()}
    if args.loader_config is None:
        return LoaderConfig(**{**defaults, **over})
    return loader_config_from_toml(args.loader_config, defaults=defaults, **over)


def verdicts(plan: ThroughputPlan | MixturePlan, bw: Bandwidth | None, h2d_gbps: float | None,
             top: Ceiling | None = None) -> list[str]:
    """Where the GPUs would wait, one line each (empty: nothing measured to compare with)."""
    lines = []
    need = plan.read_bytes_per_s_per_node
    if top is not None:
        share = plan.samples_per_s / top.samples_per_s
        lines.append(f"ceiling: {top.samples_per_s:,.0f} samples/s on {plan.ranks} ranks, bound by the {top.bound}; "
                     f"the target is {share:.0%} of it" + (": the GPUs wait on data" if share > 1 else ""))
    if bw is not None:
        fits = working_set_fits(plan, bw)
        if need > bw.page_cache_bytes_per_s:
            lines.append(f"page cache: need {_rate(need)} per node, it gives {_rate(bw.page_cache_bytes_per_s)}: "
                         "the GPUs wait even on cached data; more nodes or fewer bytes per sample (resize, nv12)")
        elif need > bw.disk_bytes_per_s and not fits:
            lines.append(f"disk: need {_rate(need)} per node, the disk gives {_rate(bw.disk_bytes_per_s)} and the "
                         f"working set ({_bytes(plan.working_set_bytes_per_node)}) exceeds the page cache: the GPUs "
                         "wait on the disk")
        elif need > bw.disk_bytes_per_s:
            lines.append(f"disk: need {_rate(need)} per node, the disk gives {_rate(bw.disk_bytes_per_s)}; the "
                         "working set fits in memory, so only the first epoch waits on the disk")
        else:
            lines.append(f"disk: need {_rate(need)} per node, the disk gives {_rate(bw.disk_bytes_per_s)}: enough")
    if h2d_gbps is not None:
        for name, rate in (("uint8", plan.h2d_bytes_per_s_uint8), ("float32", plan.h2d_bytes_per_s_float32)):
            share = rate / (h2d_gbps * 1e9)
            lines.append(f"host-to-device ({name}): {_rate(rate)} per GPU = {share:.1%} of {h2d_gbps:g} GB/s"
                         + (": the GPUs wait on the copy" if share > 1 else ""))
    if isinstance(plan, ThroughputPlan) and plan.download_bytes_per_s_per_node is not None:
        lines.append(f"cache of {_bytes(plan.cache_bytes)}: downloads {_bytes(plan.downloaded_bytes_per_epoch_per_node)} "
                     f"per epoch and node, {_rate(plan.download_bytes_per_s_per_node)} from object storage")
    return lines


def _bytes(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _rate(n: float) -> str:
    return f"{n / 1e9:.3f} GB/s" if n >= 1e8 else f"{n / 1e6:.2f} MB/s"


def table(plan: ThroughputPlan | MixturePlan, bw: Bandwidth | None, rate: LoaderRate | None = None,
          top: Ceiling | None = None) -> Table:
    t = Table(title=f"datakit plan: {plan.samples_per_s:g} samples/s on {plan.ranks} ranks ({plan.nodes} nodes)",
              show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    rows = mixture_rows(plan) if isinstance(plan, MixturePlan) else [
        ("samples per epoch / steps", f"{plan.num_anchors} / {plan.steps_per_epoch} ({plan.epoch_seconds:.1f} s at target)"),
        ("bytes per sample", f"{_bytes(plan.bytes_per_sample)} (images {_bytes(plan.image_bytes_per_sample)}, "
                             f"state+action {_bytes(plan.numeric_bytes_per_sample)}; "
                             f"{plan.kept_slots_per_step:.2f} slots kept per batch)"),
        ("images per sample, by camera", ", ".join(f"{cam} {_bytes(n)}" for cam, n in
                                                   plan.image_bytes_per_sample_by_camera.items())),
        ("read bandwidth per rank", _rate(plan.read_bytes_per_s_per_rank)),
        ("read bandwidth per node", f"{_rate(plan.read_bytes_per_s_per_node)} ({plan.ranks_per_node} ranks)"),
        ("dataset", _bytes(plan.dataset_bytes)),
        ("epoch working set per rank", _bytes(plan.working_set_bytes_per_rank)),
        ("epoch working set per node", f"{_bytes(plan.working_set_bytes_per_node)} (cache for one download per epoch)"),
        ("peak shards of one step per node", f"{_bytes(plan.peak_step_bytes_per_node)} ({plan.shuffle}; cache floor)"),
        ("host-to-device per step (uint8)", f"{_bytes(plan.h2d_image_bytes_per_step_uint8 + plan.h2d_other_bytes_per_step)}"
                                            f" = {_rate(plan.h2d_bytes_per_s_uint8)} per GPU"),
        ("host-to-device per step (float32)", f"{_bytes(plan.h2d_image_bytes_per_step_float32 + plan.h2d_other_bytes_per_step)}"
                                              f" = {_rate(plan.h2d_bytes_per_s_float32)} per GPU"),
    ]
    rows += measured_rows(plan, bw, rate, top)
    for r in rows:
        t.add_row(*r)
    return t


def mixture_rows(plan: MixturePlan) -> list[tuple[str, str]]:
    rows = [("bytes per sample", f"{_bytes(plan.bytes_per_sample)} (images {_bytes(plan.image_bytes_per_sample)}; "
                                 "share-weighted over the sources)"),
            ("read bandwidth per rank", _rate(plan.read_bytes_per_s_per_rank)),
            ("read bandwidth per node", f"{_rate(plan.read_bytes_per_s_per_node)} ({plan.ranks_per_node} ranks)"),
            ("dataset", _bytes(plan.dataset_bytes)),
            ("epoch working set per node", f"{_bytes(plan.working_set_bytes_per_node)} (every source's own epoch at once)"),
            ("host-to-device (uint8 / float32)", f"{_rate(plan.h2d_bytes_per_s_uint8)} / "
                                                 f"{_rate(plan.h2d_bytes_per_s_float32)} per GPU")]
    for p in plan.sources:
        rows.append((f"source {p.name} ({p.weight:.1%})",
                     f"{p.plan.samples_per_s:,.0f} samples/s, {_bytes(p.plan.bytes_per_sample)} per sample, "
                     f"working set per node {_bytes(p.plan.working_set_bytes_per_node)}, "
                     f"one pass of {p.plan.num_anchors} samples every {p.source_epoch_seconds:.1f} s"))
    return rows


def measured_rows(plan: ThroughputPlan | MixturePlan, bw: Bandwidth | None, rate: LoaderRate | None,
                  top: Ceiling | None) -> list[tuple[str, str]]:
    rows = []
    if bw is not None:
        rows += [("measured disk read", f"{_rate(bw.disk_bytes_per_s)} ({_bytes(bw.bytes_read)} read)"),
                 ("measured page-cache read", _rate(bw.page_cache_bytes_per_s)),
                 ("memory", _bytes(bw.memory_bytes))]
    if rate is not None:
        rows.append(("measured loader (one rank)", f"{rate.samples_per_s:,.0f} samples/s ({rate.workers} workers, "
                                                   f"{rate.cores} cores, {rate.seconds:.1f} s)"))
    if top is not None:
        disk_note = "first epoch only: the working set fits in memory" if top.working_set_fits else "binds"
        rows += [("ceiling: page-cache read", f"{top.page_cache_samples_per_s:,.0f} samples/s"),
                 ("ceiling: disk", f"{top.disk_samples_per_s:,.0f} samples/s ({disk_note})"),
                 ("ceiling: loader", f"{top.loader_samples_per_s:,.0f} samples/s ({plan.ranks} x one rank)"),
                 ("ceiling", f"{top.samples_per_s:,.0f} samples/s on {plan.ranks} ranks ({top.bound})")]
    return rows


def _run_features(args, folder: Path) -> int:
    """A feature folder (`folder`: its index files): bytes per sample and the bandwidth a target needs (no
    frame model, no --measure)."""
    plan = plan_features(folder, samples_per_s=args.samples_per_s, ranks=args.ranks,
                         ranks_per_node=args.ranks_per_node)
    if args.json:
        print(json.dumps({"features": plan.to_dict()}, indent=1))
        return 0
    t = Table(title=f"datakit plan (features): {plan.samples_per_s:g} samples/s on {plan.ranks} ranks", show_header=False)
    for row in (("clips", f"{plan.num_clips} ({_bytes(plan.dataset_bytes)})"),
                ("bytes per sample (read)", f"{_bytes(plan.bytes_per_sample)} ("
                 + ", ".join(f"{k} {_bytes(v)}" for k, v in plan.bytes_per_sample_by_field.items()) + ")"),
                ("text + state/action per sample", f"{_bytes(plan.text_bytes_per_sample)} + "
                                                   f"{_bytes(plan.numeric_bytes_per_sample)} (host-to-device)"),
                ("read bandwidth per rank / node", f"{_rate(plan.read_bytes_per_s_per_rank)} / "
                                                   f"{_rate(plan.read_bytes_per_s_per_node)}"),
                ("host-to-device per GPU", _rate(plan.h2d_bytes_per_s_per_rank))):
        t.add_row(*row)
    Console().print(t)
    return 0


def run(args) -> int:
    args.out = [str(local_path(o)) for o in args.out]  # file://x is the folder x, as for every command
    with tempfile.TemporaryDirectory(prefix="datakit-plan-") as scratch:  # a URL's index files
        folder = index_copy(args.out[0], Path(scratch)) if len(args.out) == 1 else None
        if folder is not None and is_feature_folder(folder):  # `datakit encode`'s output: clips of stored tensors
            with named_as(args.out[0], folder):
                return _run_features(args, folder)
        return _run_frames(args, Path(scratch), folder)


def _run_frames(args, scratch: Path, folder: Path | None) -> int:
    """Frame folders (`folder`: the one folder's index files, None for a mixture)."""
    cfg = loader_config(args)
    mixed = len(args.out) > 1
    if args.weights is not None and len(args.weights) != len(args.out):
        raise ValueError(f"--weights gives {len(args.weights)} weights for {len(args.out)} folders")
    if mixed and args.cache_bytes is not None:
        raise ValueError("--cache-bytes simulates one folder's cache; plan a mixture's sources one by one for it")
    weights = args.weights or (1.0,) * len(args.out)
    sources = mixture_sources([MixtureSource(root=o, weight=w, name=o) for o, w in zip(args.out, weights)]) \
        if mixed else None
    if sources:
        plan = mixture_plan(sources, cfg, samples_per_s=args.samples_per_s, ranks=args.ranks,
                            ranks_per_node=args.ranks_per_node)
    else:
        _, index, frames = local_index(args.out[0], scratch, folder)
        plan = plan_throughput(index, frames, cfg, samples_per_s=args.samples_per_s, ranks=args.ranks,
                               ranks_per_node=args.ranks_per_node, cache_bytes=args.cache_bytes)
    bw = rate = top = None
    if args.measure:
        remote = [o for o in args.out if is_remote(o)]
        if remote:
            raise ValueError(f"{remote[0]}: --measure reads the shards and needs a local folder")
        paths = [Path(o) / s.name for o in args.out for s in load_index(Path(o)).shards]
        bw = measure_bandwidth(paths, args.measure_bytes)
        if working_set_fits(plan, bw):  # time the loader in the steady state: shards cached after epoch 1
            warm_page_cache(paths, min(plan.dataset_bytes, int(CACHE_SHARE * bw.memory_bytes)))
        rate = measure_loader(sources or Path(args.out[0]), cfg, args.measure_seconds)
        top = ceiling(plan, bw, rate)
    lines = verdicts(plan, bw, args.h2d_gbps, top)
    if args.json:
        doc = {"plan": plan.to_dict(), "measured": None if bw is None else bw.__dict__,
               "loader": None if rate is None else rate.__dict__, "ceiling": None if top is None else top.__dict__,
               "verdicts": lines}
        print(json.dumps(doc, indent=1))
        return 0
    console = Console()
    console.print(table(plan, bw, rate, top))
    for line in lines:
        console.print("  " + line, highlight=False, markup=False)
    return 0

"""The throughput plan of a weighted mixture of shard folders (`datakit plan a/ b/ --weights 0.7,0.3`).

Each source is planned as one folder (`model.plan_throughput`) at its share of the target, w_s x N
samples/s, with its own slots and sample shape; the mixture's numbers combine them:
- bytes per sample = sum over sources of w_s x the source's bytes per sample (the schedule gives each
  source its weight's share of every global batch); read bandwidth follows from it;
- the cache working set per node = the sum of the sources' own epoch working sets: every source walks
  its own epochs (a small one wraps many times while a large one goes on), so a cache that downloads
  each shard once per source epoch holds each source's working set at once;
- host-to-device bytes per step = the share-weighted mean of the sources' batches.
Not modelled: a mixed batch keeps the union of its items' slots (each source's plan prunes as if its
batches were its own alone), so the image bytes are a lower bound where the sources fill different slots.
A source with fewer samples than one global batch is refused by its own plan (the loader mixes it).
`trainkit inspect` calls `mixture_plan` with the training run's loader config.
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from datakit.loader.throughput.model import ThroughputPlan, plan_throughput
from datakit.errors import IndexFileError
from datakit.loader.config import LoaderConfig
from datakit.loader.mixture import MixtureSource, normalised_weights
from datakit.shards.index import ShardIndex, load_frames, load_index
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME


@dataclass
class SourcePlan:
    name: str
    root: str
    weight: float  # normalised
    plan: ThroughputPlan  # the source alone at its share of the target (samples_per_s = weight x target)
    source_epoch_seconds: float  # one pass over the source at its share


@dataclass
class MixturePlan:
    samples_per_s: float  # the target, all ranks together
    ranks: int
    ranks_per_node: int
    nodes: int
    batch_size: int
    sources: list[SourcePlan]
    bytes_per_sample: float  # share-weighted
    image_bytes_per_sample: float
    read_bytes_per_s_per_rank: float
    read_bytes_per_s_per_node: float
    dataset_bytes: int  # all sources' shards
    working_set_bytes_per_node: int  # sum of the sources' epoch working sets per node
    h2d_bytes_per_s_uint8: float  # per rank (per GPU)
    h2d_bytes_per_s_float32: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def index_copy(out: str, scratch: Path) -> Path:
    """The folder holding the index files of shard root `out`: `out` itself, or for a URL `scratch`,
    where they are downloaded (frame and feature folders alike)."""
    from datakit.storage.urls import is_remote

    if not is_remote(out):
        return Path(out)
    from datakit.storage.transfer import download
    from datakit.storage.urls import join, resolve

    for name in (CHECKSUMS_NAME, MANIFEST_NAME, FRAMES_NAME):
        download(join(resolve(out), name), scratch / name)
    return scratch


@contextlib.contextmanager
def named_as(out: str, folder: Path) -> Iterator[None]:
    """An IndexFileError on the scratch copy of a remote index names its URL instead."""
    try:
        yield
    except IndexFileError as e:
        if folder == Path(out):
            raise
        url = out.rstrip("/")
        raise IndexFileError(e.where.replace(str(folder), url, 1), e.problem.replace(str(folder), url)) from None


def local_index(out: str, scratch: Path, folder: Path | None = None) -> tuple[Path, ShardIndex, pa.Table]:
    """(folder, index, frames table) of a shard root: a local folder, or a URL's index files downloaded
    into `scratch` (`folder`: already there, from `index_copy`); both checked against checksums.json
    as every reader loads them."""
    folder = folder or index_copy(out, scratch)
    with named_as(out, folder):
        index = load_index(folder)
        return folder, index, load_frames(folder, index)


def mixture_plan(sources: Sequence[MixtureSource], cfg: LoaderConfig, *, samples_per_s: float, ranks: int = 1,
                 ranks_per_node: int = 8, cache_bytes: int | None = None) -> MixturePlan:
    """The plan of `sources` mixed by their weights for `samples_per_s` over `ranks`, with `cfg`'s
    sample shape, batch and shuffle (a source's `slots` replace `cfg.slots` for it)."""
    weights = normalised_weights(sources)
    parts = []
    for src, w in zip(sources, weights.tolist()):
        scfg = cfg if src.slots is None else dataclasses.replace(cfg, slots=src.slots)
        with tempfile.TemporaryDirectory(prefix="datakit-plan-") as scratch:
            _, index, frames = local_index(src.root, Path(scratch))
            plan = plan_throughput(index, frames, scfg, samples_per_s=samples_per_s * w, ranks=ranks,
                                   ranks_per_node=ranks_per_node, cache_bytes=cache_bytes)
        parts.append(SourcePlan(name=src.name, root=src.root, weight=w, plan=plan,
                                source_epoch_seconds=plan.num_anchors / (samples_per_s * w)))
    first = parts[0].plan
    per_sample = sum(p.weight * p.plan.bytes_per_sample for p in parts)
    steps_per_s = samples_per_s / (ranks * first.batch_size)

    def h2d(per_step: str) -> float:  # share-weighted bytes of one rank's step, as a rate
        return steps_per_s * sum(p.weight * (getattr(p.plan, per_step) + p.plan.h2d_other_bytes_per_step)
                                 for p in parts)

    return MixturePlan(
        samples_per_s=samples_per_s, ranks=ranks, ranks_per_node=first.ranks_per_node, nodes=first.nodes,
        batch_size=first.batch_size, sources=parts, bytes_per_sample=per_sample,
        image_bytes_per_sample=sum(p.weight * p.plan.image_bytes_per_sample for p in parts),
        read_bytes_per_s_per_rank=samples_per_s / ranks * per_sample,
        read_bytes_per_s_per_node=samples_per_s * first.ranks_per_node / ranks * per_sample,
        dataset_bytes=sum(p.plan.dataset_bytes for p in parts),
        working_set_bytes_per_node=sum(p.plan.working_set_bytes_per_node for p in parts),
        h2d_bytes_per_s_uint8=h2d("h2d_image_bytes_per_step_uint8"),
        h2d_bytes_per_s_float32=h2d("h2d_image_bytes_per_step_float32"),
    )

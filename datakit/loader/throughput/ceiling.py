"""The most samples/s this machine sustains for a plan's ranks, and what binds it.

Three ceilings, each for all ranks together (the global batch splits evenly, so the node with
the most ranks sets the pace of every rank):
- page cache: nodes x (one reader's page-cache read / bytes per sample), for data that is cached;
- disk: the same with the disk's read, binding when an epoch's working set per node does not fit
  in 80% of memory (else only the first epoch reads the disk);
- loader: ranks x the measured samples/s of one rank's `ShardLoader` (its workers on this
  machine's cores; each rank needs as many), timed on cached shards when the working set fits
  in memory (the steady state after the first epoch).
The ceiling is the least of those that bind. On this machine's shards it is what
`bench/data/bench_plan.py` compares with the loader benchmark.
"""
from __future__ import annotations

from dataclasses import dataclass

from datakit.loader.throughput.measure import Bandwidth, LoaderRate
from datakit.loader.throughput.model import ThroughputPlan

CACHE_SHARE = 0.8  # of physical memory the page cache can hold for the shards


@dataclass
class Ceiling:
    page_cache_samples_per_s: float
    disk_samples_per_s: float
    loader_samples_per_s: float
    working_set_fits: bool  # the node's epoch working set fits the page cache: the disk binds only epoch 1
    samples_per_s: float  # the least of the binding ceilings
    bound: str  # "page cache", "disk" or "loader"


def working_set_fits(plan: ThroughputPlan, bw: Bandwidth) -> bool:
    return plan.working_set_bytes_per_node <= CACHE_SHARE * bw.memory_bytes


def ceiling(plan: ThroughputPlan, bw: Bandwidth, loader: LoaderRate) -> Ceiling:
    """The ceilings of `plan`'s ranks from this machine's bandwidth and loader rate."""
    per_node = plan.ranks / plan.ranks_per_node  # all ranks' samples per sample of the fullest node
    cache = per_node * bw.page_cache_bytes_per_s / plan.bytes_per_sample
    disk = per_node * bw.disk_bytes_per_s / plan.bytes_per_sample
    fits = working_set_fits(plan, bw)
    rate = plan.ranks * loader.samples_per_s
    binding = {"page cache": cache, "loader": rate}
    if not fits:
        binding["disk"] = disk
    bound = min(binding, key=binding.__getitem__)
    return Ceiling(page_cache_samples_per_s=cache, disk_samples_per_s=disk, loader_samples_per_s=rate,
                   working_set_fits=fits, samples_per_s=binding[bound], bound=bound)

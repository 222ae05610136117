"""The loader's throughput model: what a target training throughput needs from storage, cache and
the bus. `datakit plan` (datakit/commands/plan/command.py) prints it; `trainkit inspect` reads a
mixture's plan (`mixture.mixture_plan`).

- `model`: the numbers, computed from the index and a LoaderConfig (no shard is read).
- `mixture`: the same for a weighted mixture of folders, each on its own share of the samples.
- `features`: the bytes a sample of a feature folder (`datakit encode`) reads.
- `measure`: this machine's disk and page-cache read bandwidth on the shards, and the loader's own rate.
- `ceiling`: the samples/s the measured bandwidth and loader allow, and what bounds it.
"""

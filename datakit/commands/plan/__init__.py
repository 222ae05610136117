"""`datakit plan`: what a target training throughput needs from storage, cache and the bus.

- `model`: the numbers, computed from the index and a LoaderConfig (no shard is read).
- `measure`: this machine's disk and page-cache read bandwidth on the shards, when asked.
- `command`: the CLI (`add_parser` / `run`), a table or --json, and where the GPUs would wait.
"""

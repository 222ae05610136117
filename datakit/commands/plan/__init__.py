"""`datakit plan`: what a target training throughput needs from storage, cache and the bus.

- `command`: the CLI (`add_parser` / `run`), a table or --json, and where the GPUs would wait.
The numbers are the loader's throughput model (datakit/loader/throughput/).
"""

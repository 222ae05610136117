"""Who runs the planned shards: engine.py (the unit of work, and how a pool's workers are tied to
the parent and stopped), local.py (one task per shard on a process pool), local_split.py (one
task per episode below the shard), ray.py (one Ray task per shard; ray_address.py checks the
cluster's address first). run.py (the orchestrator) picks one; none imports another."""

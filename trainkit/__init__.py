"""trainkit: FSDP2 trainers that consume datakit shards.

    trainkit run CONFIG.toml [--set key=value ...]      # one process, or torchrun for GPUs / nodes
    trainkit inspect CONFIG.toml [--json]               # params, tokens, FLOPs, units, memory (meta device)

Read in this order (the flow from config to step): config.py (one dataclass tree from TOML) ->
models/ (families: pi05) -> parallel/ (each optimisation a function; parallelize() applies them
in order) -> data.py (shards -> model batches through datakit.loader) -> train.py (the loop) ->
metrics.py / profile.py (what a step cost) -> checkpoint.py (DCP, resume, also on another world
size) -> cli.py; sample_log.py (debug: the rows each rank trained on). Many nodes: docs/multi-node.md.
Example configs: configs/pi05_{tiny,baseline,optimised}.toml; measurements: bench/results/trainkit.md.
"""

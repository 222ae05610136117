"""trainkit: FSDP2 trainers that consume datakit shards.

    trainkit run CONFIG.toml [--set key=value ...]      # one process, or torchrun for GPUs / nodes
    trainkit inspect CONFIG.toml [--json]               # params, tokens, FLOPs, units, memory (meta device)

Read in this order (the flow from config to step, then what the step leaves):
config/ (one dataclass tree from TOML: sections, data, load, checks) -> configs/ (the presets per
family, package data) -> errors.py (every user-facing error) -> models/ (the family registry and
record, shared layers, one package per family) -> data.py (shards -> the family's batches through
datakit.loader) -> parallel/ (each optimisation a function; parallelize() applies them in order) ->
optim/ (optimizer, non-finite guard, EMA) -> train.py (build -> parallelize -> loop -> checkpoint,
top to bottom) -> validation.py (held-out episodes) -> observe/ (metrics, profile, summary, sample
log) -> checkpoint/ (DCP save and resume, manifest, safe reader, run lock) -> weights/ (init_from,
export) -> estimate/ (inspect and the memory model) -> trials/ (ladder, tune) -> predict/ (open-loop
action error) -> cli.py. Many nodes: docs/multi-node.md; measurements: bench/results/trainkit.md.
"""

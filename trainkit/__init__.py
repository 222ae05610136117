"""trainkit: FSDP2 trainers that consume datakit shards (under construction; see issues)."""

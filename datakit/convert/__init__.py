"""`datakit convert SRC OUT`: episodes -> verified uint8 frame shards + global index.

    from datakit.convert import convert
    summary = convert(src, out, ConvertConfig(...))

`convert` only says where the work runs: folders on this machine go straight to the
orchestrator (run.py); an fsspec URL or a Hub repo id goes through local staging folders
(remote/run.py), which calls the same orchestrator.

One module per job, in the order of the flow: config.py (the options), plan.py (the shard
plan), outdir.py (the output-folder protocol), episode.py (one episode -> tar members),
shard.py (one shard and its commit), split.py (part files below the shard), journal.py (the
resume journal), engines/ (who runs the shards: engine.py, what every engine shares; local.py,
local_split.py, ray.py), assemble.py (the index from the journals), run.py (the orchestrator),
remote/ (object storage around it: run.py, source.py, publish.py).
"""
from __future__ import annotations

from pathlib import Path

from datakit.convert.config import ConvertConfig
from datakit.convert.remote.run import convert_remote, is_remote_job
from datakit.convert.run import ConvertSummary, convert_local


def convert(src: str | Path, out: str | Path, cfg: ConvertConfig, *, force: bool = False,
            command: str | None = None) -> ConvertSummary:
    """Convert SRC into shards in OUT, resuming an interrupted run of the same source with the
    same options; `force` starts over (our own files in OUT are removed first). `command` is
    recorded in OUT's lock, to name this run to a second one. SRC may be an fsspec URL or a Hub
    repo id, OUT an fsspec URL (pass URLs as str): see remote/run.py."""
    if is_remote_job(src, out):  # fsspec URL or Hub repo id: staged through local folders
        return convert_remote(src, out, cfg, force=force, command=command)
    return convert_local(Path(src), Path(out), cfg, force=force, command=command)

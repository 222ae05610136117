"""`datakit convert SRC OUT`: episodes -> verified uint8 frame shards + global index.

Flow: scan the source -> plan shards (consecutive episodes, closed after the episode whose
predicted bytes reach --shard-size; the plan depends only on the source metadata and the
options) -> each shard is written by one worker, episode after episode, straight into
`shard-N.tar.tmp` (hashed on the fly, fsynced, renamed, then journaled) -> after every shard is
closed, frames.arrow, then index.json. A rerun after a crash or kill -9 keeps the journaled
shards that still hash right and redoes the others: the same bytes as an unbroken run, with any
number of workers.

One module per job: plan.py (the shard plan), outdir.py (the output-folder protocol),
shard.py (one shard and its commit), journal.py (the resume journal), local.py (the local
engine), assemble.py (the index from the journals). This file only orchestrates them.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from datakit.config import ConvertConfig
from datakit.convert.assemble import build_index
from datakit.convert.journal import STAGING, Journal, load_journals
from datakit.convert.local import run_shards
from datakit.convert.outdir import prepare_output
from datakit.convert.plan import plan_shards, predicted_bytes
from datakit.shards.index import ShardIndex, load_index, write_index
from datakit.sources import scan

__all__ = ["ConvertSummary", "Journal", "convert", "plan_shards", "predicted_bytes"]


@dataclass
class ConvertSummary:
    index: ShardIndex
    seconds: float
    resumed_shards: int = 0
    already_complete: bool = False
    decoders: dict[str, int] = field(default_factory=dict)  # backend -> camera-episodes decoded


def convert(src: str | Path, out: str | Path, cfg: ConvertConfig) -> ConvertSummary:
    """Convert SRC into shards in OUT (resuming an interrupted run with the same options)."""
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    spec = scan(src, cfg.format)
    options = cfg.output_options()
    if prepare_output(out, options):
        shutil.rmtree(out / STAGING, ignore_errors=True)  # a crash after index.json left it behind
        return ConvertSummary(load_index(out), time.perf_counter() - t0, already_complete=True)
    plan = plan_shards(spec, cfg)
    kept = load_journals(out, plan)
    for tmp in out.glob("shard-*.tar.tmp"):  # left by a killed run
        tmp.unlink()
    jobs = [(i, refs) for i, refs in enumerate(plan) if i not in kept]
    tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked after this
    with tqdm(total=sum(r.length for _, refs in jobs for r in refs), unit="frame", desc=f"convert {src.name}",
              disable=not cfg.progress, dynamic_ncols=True, smoothing=0.1) as bar:
        new = run_shards(spec, cfg, out, jobs, bar)
    journals = sorted([*kept.values(), *new], key=lambda j: j.index)
    index, table = build_index(spec, cfg, journals)
    write_index(out, index, table)  # last: its presence means finished
    shutil.rmtree(out / STAGING, ignore_errors=True)
    decoders: dict[str, int] = {}
    for j in new:
        for b, n in j.decoders.items():
            decoders[b] = decoders.get(b, 0) + n
    return ConvertSummary(index, time.perf_counter() - t0, resumed_shards=len(kept), decoders=decoders)

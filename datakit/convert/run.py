"""The orchestrator of a local conversion (SRC and OUT folders on this machine): scan, plan,
run an engine, check the commits, write the index. `datakit.convert.convert` calls it, and
so does `remote/run.py` between its staging folders.

Flow: scan the source -> plan shards (consecutive episodes, closed after the episode whose
predicted bytes reach --shard-size; the plan depends only on the source metadata and the
options) -> each shard is written by one worker, episode after episode, straight into
`shard-N.tar.tmp` (hashed on the fly, fsynced, renamed, then journaled) -> every shard the
engine reports done is checked committed -> after every shard is closed, frames.arrow, then
index.json. A rerun after a crash or kill -9 keeps the journaled shards that still hash right
and redoes the others: the same bytes as an unbroken run, with any number of workers.
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from datakit.convert.config import ConvertConfig
from datakit.convert.assemble import build_index, empty_shards
from datakit.convert.fingerprint import source_fingerprint
from datakit.convert.journal import load_journals
from datakit.convert.engines.local import run_shards
from datakit.convert.outdir import claim_output, open_output, output_lock, remove_ours
from datakit.convert.plan import plan_shards, plan_workers
from datakit.progress import progress_bar
from datakit.convert.engines.ray import run_shards_ray  # imports ray only when used
from datakit.convert.shard import check_committed
from datakit.decoders import describe_choice
from datakit.errors import output_error
from datakit.shards.index import ShardIndex, load_index, write_index
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, INDEX_FILES, MANIFEST_NAME, SHARD_TMP_GLOB, STAGING
from datakit.sources import scan

@dataclass
class ConvertSummary:
    index: ShardIndex
    seconds: float
    resumed_shards: int = 0
    already_complete: bool = False
    decoders: dict[str, int] = field(default_factory=dict)  # backend -> camera-episodes decoded
    decoder_why: str = ""  # which decoder was used, and why (auto's ranking, a fallback)
    workers: str = ""  # how many worker processes, and why
    traces: dict[int, str] = field(default_factory=dict)  # skipped episode -> traceback (for --debug)


def remove_unfinished(out: Path) -> None:
    """What a stopped run left in OUT: temporary files, and index files without the checksums
    file that would make them a finished conversion."""
    for pattern in (SHARD_TMP_GLOB, f"{FRAMES_NAME}.tmp", f"{MANIFEST_NAME}.*.tmp", f"{CHECKSUMS_NAME}.*.tmp"):
        for tmp in out.glob(pattern):
            tmp.unlink(missing_ok=True)
    for name in INDEX_FILES:
        (out / name).unlink(missing_ok=True)


def _write_index(out: Path, index: ShardIndex, table) -> None:
    """write_index, with an OSError named after the index file it was writing (pyarrow's and
    file.write's errors carry no file name): the first one not in place yet."""
    try:
        write_index(out, index, table)
    except OSError as e:
        failed = next((out / n for n in INDEX_FILES if not (out / n).exists()), out)
        remove_unfinished(out)
        raise output_error(failed, e) from e


def convert_local(src: Path, out: Path, cfg: ConvertConfig, *, force: bool = False,
                  command: str | None = None) -> ConvertSummary:
    """Convert the folder SRC into shards in the folder OUT, resuming an interrupted run of the
    same source with the same options; `force` starts over (our own files in OUT are removed
    first). `command` is recorded in OUT's lock, to name this run to a second one."""
    t0 = time.perf_counter()
    spec = scan(src, cfg.format)
    claim_output(out)  # OUT is ours (or empty) before anything is written into it
    with output_lock(out, command):
        if force:
            remove_ours(out)
        fingerprint = source_fingerprint(spec)
        if open_output(out, cfg.output_options(), fingerprint, spec):
            shutil.rmtree(out / STAGING, ignore_errors=True)  # a crash after the checksums left it behind
            return ConvertSummary(load_index(out), time.perf_counter() - t0, already_complete=True)

        plan = plan_shards(spec, cfg)
        kept = load_journals(out, plan, list(spec.cameras), len(spec.state_names), len(spec.action_names))
        remove_unfinished(out)  # left by a killed run
        jobs = [(i, refs) for i, refs in enumerate(plan) if i not in kept]
        if cfg.engine == "local":
            wp = plan_workers(cfg, [refs for _, refs in jobs], cameras=len(spec.cameras))
            if wp.clamped_from is not None:
                logging.getLogger("datakit").warning(f"datakit convert: warning: --workers {wp.clamped_from} is "
                                                     f"more than the {wp.workers} usable cores; using {wp.workers}")
            cfg = dataclasses.replace(cfg, workers=wp.workers)
        with progress_bar(sum(r.length for _, refs in jobs for r in refs), f"convert {src.name}",
                          enabled=cfg.progress, waiting="reading the first episode") as bar:
            new = (run_shards_ray if cfg.engine == "ray" else run_shards)(spec, cfg, out, jobs, bar)
        check_committed(out, new)  # a commit can fail late, after its shard was reported done

        journals = sorted([*kept.values(), *new], key=lambda j: j.index)
        index, table = build_index(spec, cfg, journals, fingerprint)
        _write_index(out, index, table)  # last: the checksums file it ends with means finished
        for name in empty_shards(journals):  # all its episodes skipped: not in the index
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / STAGING, ignore_errors=True)
    decoders: dict[str, int] = {}
    for j in new:
        for b, n in j.decoders.items():
            decoders[b] = decoders.get(b, 0) + n
    traces = {s.episode_index: s.trace for j in journals for s in j.skipped if s.trace}
    return ConvertSummary(index, time.perf_counter() - t0, resumed_shards=len(kept), decoders=decoders,
                          decoder_why=describe_choice(cfg.decoder, decoders, spec),
                          workers=f"{wp.workers} ({wp.why})" if cfg.engine == "local" else "", traces=traces)

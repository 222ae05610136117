"""`datakit verify` on a feature folder (`datakit encode`'s output): the checks of `folder.py`
for the feature format.

1. index.json and frames.arrow against checksums.json (`checksum_problems`, shared);
2. index.json field by field (`shards/features.py`), the clip table's schema and row count, every
   clip's offsets inside its shard;
3. each shard: size, sha256, and every indexed tensor (clip fields, prompt embeddings) against the
   tar headers: a member starts exactly there, with the .npy header of the index's dtype and shape.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from datakit.errors import IndexFileError, Problem
from datakit.shards.features import (
    DTYPES, PROMPT_KEY, FeatureIndex, check_clip_reads, load_clips, load_features,
)
from datakit.shards.index import FRAME_KEY, OFFSET_PREFIX, column
from datakit.shards.names import FRAMES_NAME
from datakit.shards.writer import npy_header
from datakit.verify.folder import ShardFile, VerifyReport, _tar_members, checksum_problems, shard_intact


def _expected(index: FeatureIndex, table) -> dict[int, dict[str, tuple[int, bytes]]]:
    """Per shard: member name -> (data offset, the .npy header it must carry)."""
    want: dict[int, dict[str, tuple[int, bytes]]] = {i: {} for i in range(len(index.shards))}
    shard, ep, start = column(table, "shard"), column(table, "episode_index"), column(table, "start")
    for name, f in index.fields.items():
        hdr = npy_header(tuple(f.shape), np.dtype(DTYPES[f.dtype][1]))
        for s, e, t, o in zip(shard.tolist(), ep.tolist(), start.tolist(), column(table, OFFSET_PREFIX + name).tolist()):
            want[s][f"{FRAME_KEY.format(episode=e, frame=t)}.{name}.npy"] = (o, hdr)
    for p, e in enumerate(index.prompts):
        hdr = npy_header((e.tokens, index.text_width), np.dtype(DTYPES[index.text_dtype][1]))
        want[e.shard][f"{PROMPT_KEY.format(prompt=p)}.text.npy"] = (e.offset, hdr)
    return want


def _check_members(path: Path, want: dict[str, tuple[int, bytes]], rep: VerifyReport) -> None:
    """Each indexed tensor of one shard starts where the index says, after its .npy header."""
    found = _tar_members(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for name, (off, hdr) in want.items():
        if name not in found:
            rep.problems.append(Problem(str(path), f"member {name} is missing"))
        elif found[name] + len(hdr) != off:
            rep.problems.append(Problem(str(path), f"member {name} is at {found[name]}, the index says "
                                                   f"{off - len(hdr)}"))
        elif data[found[name] : off].tobytes() != hdr:
            rep.problems.append(Problem(str(path), f"member {name} is not the index's dtype and shape"))
        rep.offsets_checked += 1


def check_features(out: Path, shard_file: ShardFile) -> VerifyReport:
    """Every check of the module docstring on the index files in `out`; each shard reached through
    `shard_file(entry)` as `folder.check_folder` reaches one (a remote root: downloaded one at a time)."""
    rep = VerifyReport()
    sums = checksum_problems(out)
    index = load_features(out, against_checksums=False)
    table = load_clips(out, index, against_checksums=False)
    rep.frames = index.num_clips
    try:
        check_clip_reads(index, column(table, "shard"), {f: column(table, OFFSET_PREFIX + f) for f in index.fields},
                         out / FRAMES_NAME)
        want = _expected(index, table)
    except IndexFileError as e:
        rep.problems.append(Problem.of(e))
        want = {}
    for i, entry in enumerate(index.shards):
        rep.shards += 1
        with shard_file(entry) as (path, size):
            if shard_intact(path, size, entry, rep):
                _check_members(path, want.get(i, {}), rep)
    rep.problems += sums
    return rep

"""Plant damage in a converted output folder (a copy), for the reader and verify tests.

Edits go through plain json / pyarrow, not datakit's writers. `rehash=True` rewrites
checksums.json to match the damaged files (hashlib), so a test proves that the structural
checks, not only the checksums, catch the damage.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

MANIFEST, FRAMES, CHECKSUMS = "index.json", "frames.arrow", "checksums.json"


def copy_out(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rehash(out: Path) -> None:
    sums = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in (MANIFEST, FRAMES)}
    (out / CHECKSUMS).write_text(json.dumps({"sha256": sums}))


def edit_manifest(out: Path, fn: Callable[[dict], None], *, rehash_after: bool = True) -> None:
    d = json.loads((out / MANIFEST).read_text())
    fn(d)
    (out / MANIFEST).write_text(json.dumps(d))
    if rehash_after:
        rehash(out)


def read_table(out: Path) -> pa.Table:
    with pa.memory_map(str(out / FRAMES)) as src:
        return ipc.open_file(src).read_all().combine_chunks()


def edit_column(out: Path, name: str, fn: Callable[[np.ndarray], None], *, rehash_after: bool = True) -> None:
    """Apply `fn` in place to a numpy copy of a primitive column (or the flat values of a list column)."""
    t = read_table(out)
    col = t.column(name).chunk(0)
    if pa.types.is_fixed_size_list(col.type):
        vals = col.flatten().to_numpy().copy()
        fn(vals)
        new = pa.FixedSizeListArray.from_arrays(pa.array(vals), col.type.list_size)
    else:
        vals = col.to_numpy().copy()
        fn(vals)
        new = pa.array(vals, type=col.type)
    t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), new)
    (out / FRAMES).unlink()
    with pa.OSFile(str(out / FRAMES), "wb") as sink, ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    if rehash_after:
        rehash(out)

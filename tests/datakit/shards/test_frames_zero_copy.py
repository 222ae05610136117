"""frames.arrow columns stay zero-copy past 1M rows (issue 7 §7): `write_frames` writes one
record batch, `column()` returns views into the memory map, and a multi-batch file fails
clearly instead of being copied.

Oracles: the address range of pyarrow's own memory map of the file, pyarrow's allocator
counter (a copy would allocate from it), and numpy arrays the table was built from.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from datakit.errors import IndexFileError
from datakit.shards.index import column, frames_schema, load_frames, write_frames

ROWS = 1_100_000  # more than the 1 << 20 rows per batch the old writer used


def _table(rows: int) -> tuple[pa.Table, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    cols = {
        "episode_index": np.repeat(np.arange(rows // 1000, dtype=np.int64), 1000)[:rows],
        "frame_index": np.tile(np.arange(1000, dtype=np.int64), rows // 1000 + 1)[:rows],
        "timestamp": np.arange(rows, dtype=np.float64) / 10,
        "task_index": np.zeros(rows, np.int64),
        "state": rng.standard_normal((rows, 2)).astype(np.float32),
        "action": rng.standard_normal((rows, 1)).astype(np.float32),
        "shard": np.zeros(rows, np.int32),
        "offset/cam": np.arange(rows, dtype=np.int64) * 4096,
    }
    schema = frames_schema(["cam"], 2, 1)
    arrays = [pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]) if v.ndim == 2 else pa.array(v)
              for v in cols.values()]
    return pa.Table.from_arrays(arrays, schema=schema), cols


def _inside(arr: np.ndarray, lo: int, size: int) -> bool:
    addr = arr.__array_interface__["data"][0]
    return lo <= addr and addr + arr.nbytes <= lo + size


def test_columns_of_a_large_table_are_views_of_the_memory_map(tmp_path):
    table, cols = _table(ROWS)
    path = tmp_path / "frames.arrow"
    write_frames(path, table)
    del table
    src = pa.memory_map(str(path), "r")
    mapped = src.read_buffer(src.size())  # zero-copy: its address is where the file is mapped
    src.seek(0)
    t = ipc.open_file(src).read_all()
    before = pa.total_allocated_bytes()
    for name, want in cols.items():
        got = column(t, name)
        assert got.shape == want.shape and np.array_equal(got, want), name
        assert _inside(got, mapped.address, mapped.size), f"{name} was copied out of the map"
        assert not got.flags.writeable
    assert pa.total_allocated_bytes() - before < 1 << 20  # nothing the size of a column was allocated


def test_load_frames_gives_zero_copy_columns(tmp_path):
    table, cols = _table(ROWS)
    write_frames(tmp_path / "frames.arrow", table)
    before = pa.total_allocated_bytes()
    t = load_frames(tmp_path)
    assert t.column("state").num_chunks == 1
    np.testing.assert_array_equal(column(t, "state"), cols["state"])
    assert pa.total_allocated_bytes() - before < 1 << 20


def test_multi_batch_file_fails_clearly_instead_of_copying(tmp_path):
    table, _ = _table(3000)
    path = tmp_path / "frames.arrow"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=1000)  # what datakit wrote before, at > 1M rows
    t = load_frames(tmp_path)
    with pytest.raises(IndexFileError, match="frames.arrow: column 'state' is split into 3 record batches"):
        column(t, "state")


def test_empty_table_gives_empty_columns(tmp_path):
    table, _ = _table(0)
    write_frames(tmp_path / "frames.arrow", table)
    t = load_frames(tmp_path)
    assert column(t, "state").shape == (0, 2) and column(t, "shard").shape == (0,)

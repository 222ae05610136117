"""Readers trust only checked files (issue 14, items 4 and 6): every reader compares index.json
and frames.arrow with checksums.json when it opens OUT, refuses an OUT without checksums.json,
and notices OUT being rewritten under it when it opens a shard.

Damage is planted with plain json / pyarrow / byte edits (tests/fixtures/damage.py) in a copy of a real
conversion, leaving checksums.json as the conversion wrote it: each edit below is structurally
valid (the field checks pass it), so only the checksums can catch it. The oracle for "silently
wrong" is the original folder read with stock tarfile + numpy.
"""
from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pytest

from datakit.cli import main
from datakit.errors import IndexFileError
from datakit.loader import LeRobotView, LoaderConfig, ShardDataset, ShardLoader, webdataset_urls
from datakit.reader import open_shards
from datakit.shards.index import load_frames, load_index
from damage import CHECKSUMS, FRAMES, MANIFEST, copy_out, edit_column, edit_manifest
from loader_fixtures import CAMS, shards_rgb  # noqa: F401

pytestmark = pytest.mark.timeout(120)

READERS = {
    "ShardReader": lambda out: open_shards(out).read_frame(0, 0, CAMS[0]),
    "ShardDataset": lambda out: ShardDataset(out, LoaderConfig(shuffle="sequential"))[0],
    "ShardLoader": lambda out: next(iter(ShardLoader(out, LoaderConfig(batch_size=4, shuffle="sequential",
                                                                       pin_memory=False)))),
    "LeRobotView": lambda out: LeRobotView(out)[0],
    "webdataset_urls": webdataset_urls,
    "load_index": load_index,
}


def _refused_naming(out, name: str, *match: str, readers=READERS) -> None:
    for reader, read in readers.items():
        with pytest.raises(IndexFileError) as err:
            read(out)
        msg = str(err.value)
        assert "\n" not in msg and str(out / name) in msg, (reader, msg)
        for m in match:
            assert m in msg, (reader, msg)


FRAMES_READERS = {k: v for k, v in READERS.items() if k not in ("webdataset_urls", "load_index")}


@pytest.mark.parametrize("column,edit", [
    ("offset/" + CAMS[0], lambda v: v.__setitem__(3, v[3] + 64)),  # still inside the shard
    ("shard", lambda v: v.__setitem__(np.flatnonzero(v == 0)[-1], 1)),  # a row pointing at another shard
    ("state", lambda v: v.__setitem__(5, v[5] + 1.0)),
])
def test_edited_frames_table_is_refused_at_open(shards_rgb, tmp_path, column, edit):
    out = copy_out(shards_rgb, tmp_path / "out")
    edit_column(out, column, edit, rehash_after=False)
    _refused_naming(out, FRAMES, f"sha256 differs from {CHECKSUMS}", readers=FRAMES_READERS)


@pytest.mark.parametrize("edit", [
    lambda d: d["stats"]["state"]["mean"].__setitem__(0, 123.0),
    lambda d: d["tasks"].__setitem__(0, "another task"),
    lambda d: d["episodes"][0].update(task="another task"),
])
def test_edited_manifest_is_refused_at_open(shards_rgb, tmp_path, capsys, edit):
    out = copy_out(shards_rgb, tmp_path / "out")
    edit_manifest(out, edit, rehash_after=False)
    _refused_naming(out, MANIFEST, f"sha256 differs from {CHECKSUMS}")
    capsys.readouterr()
    assert main(["info", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and MANIFEST in err


def test_out_without_checksums_is_refused(shards_rgb, tmp_path):
    """docs/shard-format.md calls such an OUT unfinished: no reader may use it."""
    out = copy_out(shards_rgb, tmp_path / "out")
    (out / CHECKSUMS).unlink()
    _refused_naming(out, CHECKSUMS, "missing")


def test_garbage_checksums_is_refused(shards_rgb, tmp_path):
    out = copy_out(shards_rgb, tmp_path / "out")
    (out / CHECKSUMS).write_text('{"sha256": {"index.json": 5}}')
    _refused_naming(out, CHECKSUMS)


def test_intact_out_still_opens_and_the_frames_check_runs_once_per_file(shards_rgb, tmp_path, monkeypatch):
    """The check is on the bytes readers use; an unchanged frames.arrow is hashed once per process
    (forked loader workers inherit that), and hashed again after any write to the file."""
    import types

    from datakit.shards import checksums as checksums_mod

    out = copy_out(shards_rgb, tmp_path / "out")
    frames_size = (out / FRAMES).stat().st_size
    sizes = []

    def sha256(data):
        sizes.append(len(data))
        return hashlib.sha256(data)

    monkeypatch.setattr(checksums_mod, "hashlib", types.SimpleNamespace(sha256=sha256))
    for _ in range(2):
        open_shards(out).read_frame(0, 0, CAMS[0])
    assert sizes.count(frames_size) == 1
    data = (out / FRAMES).read_bytes()
    (out / FRAMES).write_bytes(data)  # the same bytes, written again: hashed again
    load_frames(out, load_index(out))
    assert sizes.count(frames_size) == 2


# --- item 6: OUT rewritten under a reader -------------------------------------------------------
def _other_conversion(out) -> None:
    """Turn `out` into another conversion with the same shard sizes, as `convert OTHER --force`
    would: checksums.json goes first, each shard is replaced by rename, the index files are
    written anew, checksums.json last. The shards' pixels are inverted (same sizes)."""
    index = json.loads((out / MANIFEST).read_text())
    (out / CHECKSUMS).unlink()
    for s in index["shards"]:
        data = bytearray((out / s["name"]).read_bytes())
        for off in load_frames(out).column("offset/" + CAMS[0]).to_numpy():
            if off >= 0:
                data[off:off + 16] = bytes(255 - b for b in data[off:off + 16])
        tmp = out / (s["name"] + ".tmp")
        tmp.write_bytes(bytes(data))
        os.replace(tmp, out / s["name"])
        s["sha256"] = hashlib.sha256(data).hexdigest()
    (out / MANIFEST).write_text(json.dumps(index))
    sums = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in (MANIFEST, FRAMES)}
    (out / CHECKSUMS).write_text(json.dumps({"sha256": sums}))


def _second_shard_row(r) -> int:
    return int(np.flatnonzero(r.shard == 1)[0])


def test_reader_notices_out_rewritten_under_it(shards_rgb, tmp_path):
    out = copy_out(shards_rgb, tmp_path / "out")
    r = open_shards(out)
    first = r.read_raw(0, CAMS[0]).copy()  # shard 0 open before the rewrite: its old bytes stay valid
    _other_conversion(out)
    assert np.array_equal(r.read_raw(0, CAMS[0]), first)
    with pytest.raises(IndexFileError) as err:
        r.read_raw(_second_shard_row(r), CAMS[0])
    msg = str(err.value)
    assert "\n" not in msg and str(out / CHECKSUMS) in msg and "changed" in msg, msg


def test_reader_notices_a_rewrite_in_progress(shards_rgb, tmp_path):
    out = copy_out(shards_rgb, tmp_path / "out")
    r = open_shards(out)
    (out / CHECKSUMS).unlink()  # what --force removes first
    with pytest.raises(IndexFileError, match="checksums.json: .*gone"):
        r.read_raw(_second_shard_row(r), CAMS[0])


def test_loader_notices_out_rewritten_under_it(shards_rgb, tmp_path):
    """The loader's batches after the rewrite fail instead of returning the other data."""
    out = copy_out(shards_rgb, tmp_path / "out")
    loader = ShardLoader(out, LoaderConfig(batch_size=4, shuffle="sequential", pin_memory=False, num_workers=0))
    it = iter(loader)
    next(it)
    _other_conversion(out)
    with pytest.raises(IndexFileError, match="changed"):
        for _ in it:
            pass


# --- item 5: shards in the node-local cache are re-hashed on first use in each process ----------
def test_damaged_shard_in_the_cache_is_rehashed_and_fetched_again(converted, uploaded, tmp_path):
    """A byte flipped in a cached shard after its download: a later reader (what a new process
    is) with verify="sha256" hashes it on first use, drops it and downloads it again, so the
    frame it returns is the original's (stock tarfile's bytes of the local copy)."""
    import tarfile
    import warnings

    from storage_fixtures import CAMS as S3_CAMS

    cache = tmp_path / "cache"
    first = open_shards(uploaded, verify="sha256", cache_dir=cache, cache_bytes=1 << 30)
    row, cam = 0, S3_CAMS[0]
    first.read_raw(row, cam)  # downloads and hashes shard 0
    cached = first.files.cache.folder / first.index.shards[0].name
    off = int(first.offsets[cam][row])
    data = bytearray(cached.read_bytes())
    data[off] ^= 0xFF
    cached.write_bytes(bytes(data))  # same size: a size check cannot see it
    with tarfile.open(converted / first.index.shards[0].name) as tf:
        member = tf.getmember(f"{0:06d}/{0:06d}.{cam}.npy")
        want = np.load(io.BytesIO(tf.extractfile(member).read()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = open_shards(uploaded, verify="sha256", cache_dir=cache, cache_bytes=1 << 30).read_raw(row, cam)
    assert np.array_equal(got, want)
    assert any("cached copy damaged" in str(w.message) for w in caught)
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == first.index.shards[0].sha256


@pytest.mark.parametrize("rewrite", ["in progress", "finished"])
def test_remote_root_rewritten_under_a_reader_is_noticed_at_the_next_download(uploaded, tmp_path, rewrite):
    """The cache reads the remote checksums.json again after each shard download: a root being
    rewritten (checksums.json gone) or rewritten (another conversion's) fails naming it."""
    import s3fs

    r = open_shards(uploaded, cache_dir=tmp_path / "cache", cache_bytes=1 << 30)
    r.read_raw(0, r.cameras[0])  # shard 0 downloaded before the rewrite
    fs = s3fs.S3FileSystem()
    sums = f"{uploaded}/{CHECKSUMS}"
    if rewrite == "in progress":
        fs.rm_file(sums)
    else:
        d = json.loads(fs.cat_file(sums))
        d["sha256"][MANIFEST] = hashlib.sha256(b"another conversion").hexdigest()
        fs.pipe_file(sums, json.dumps(d).encode())
    with pytest.raises(IndexFileError) as err:
        r.read_raw(_second_shard_row(r), r.cameras[0])
    msg = str(err.value)
    assert msg.startswith(sums) and ("gone" if rewrite == "in progress" else "changed") in msg, msg
    assert not (r.files.cache.folder / r.index.shards[1].name).exists()  # the other conversion's shard is not kept

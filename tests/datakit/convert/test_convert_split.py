"""Below the shard (datakit/convert/split.py): episodes converted in parallel into part files
and joined into their shard in plan order give the bytes of the one-writer path, and a plan
with fewer shards than --workers really runs its episodes in several processes.

Oracles: the one-writer path (--workers 1, episodes appended straight into the shard), stock
tarfile for the member layout, and the pixel offsets checked against the .npy payloads."""
from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

import datakit.convert.engines.local_split as local_split
from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.convert.split import join_parts, write_part
from datakit.errors import SourceError
from datakit.shards.writer import ShardFile
from datakit.convert.episode import convert_episode
from datakit.sources import scan
from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes

LENGTHS = (9, 14, 6, 11)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("s") / "ds", version="v2.1", codec="h264",
                                episode_lengths=LENGTHS, height=64, width=96)


@pytest.fixture(scope="module")
def one_writer(src, tmp_path_factory):
    """The reference: one process, one writer, one shard (the default --shard-size)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False))
    return out


def test_parts_joined_in_order_equal_the_one_writer_shard(src, tmp_path):
    """write_part in any order (last episode first), join_parts in plan order: the shard is the
    one ShardFile gets from convert_episode episode after episode, and every offset points at
    its frame's pixels."""
    spec = scan(src)
    cfg = ConvertConfig(workers=1, progress=False)
    (tmp_path / "parts").mkdir()
    parts = {ref.episode_index: write_part(spec, cfg, tmp_path / "parts", 0, ref) for ref in reversed(spec.episodes)}
    j, shard = join_parts(cfg, tmp_path, 0, spec.episodes, [parts[r.episode_index] for r in spec.episodes])
    shard.commit()
    assert not list((tmp_path / "parts").iterdir())  # each part removed once copied

    (tmp_path / "single").mkdir()
    single = ShardFile(tmp_path / "single" / "shard-000000.tar")
    bases = [convert_episode(spec, ref, cfg, single).base for ref in spec.episodes]
    single.close()
    joined = (tmp_path / "shard-000000.tar").read_bytes()
    assert joined == (tmp_path / "single" / "shard-000000.tar").read_bytes()
    assert [p.base for p in j.placed] == bases

    with tarfile.open(fileobj=io.BytesIO(joined)) as tf:  # stock tarfile: every member where we said
        members = {m.name: m for m in tf.getmembers()}
        for p in j.placed:
            for t in range(p.length):
                m = members[f"{p.episode_index:06d}/{t:06d}.observation.images.top.npy"]
                arr = np.load(io.BytesIO(tf.extractfile(m).read()))
                off = p.base + int(p.offsets["observation.images.top"][t])
                assert off > m.offset_data
                got = np.frombuffer(joined[off:off + arr.nbytes], np.uint8).reshape(arr.shape)
                np.testing.assert_array_equal(got, arr)
    assert len(members) == sum(LENGTHS) * 6  # 3 cameras, state, action, json per frame


@pytest.mark.timeout(120)
def test_one_shard_plan_uses_every_worker(src, one_writer, tmp_path, monkeypatch):
    """A one-shard plan with --workers 2: its episodes run in two worker processes (forked, so
    the recording wrapper below is theirs too), and the output is the one-writer output."""
    log = tmp_path / "pids"
    log.mkdir()
    real = local_split.write_part

    def recording(spec, cfg, scratch, shard, ref, *progress):
        (log / f"{ref.episode_index}-{os.getpid()}").touch()
        return real(spec, cfg, scratch, shard, ref, *progress)

    monkeypatch.setattr(local_split, "write_part", recording)
    monkeypatch.setenv("DATAKIT_MP_START", "fork")
    out = tmp_path / "out"
    convert(src, out, ConvertConfig(workers=2, progress=False))
    seen = [name.split("-") for name in os.listdir(log)]
    assert sorted(int(e) for e, _ in seen) == list(range(len(LENGTHS)))
    pids = {int(p) for _, p in seen}
    assert len(pids) == 2 and os.getpid() not in pids, pids
    assert tree_bytes(out) == tree_bytes(one_writer)
    assert not (out / ".datakit-staging").exists()


@pytest.mark.timeout(120)
def test_bad_episode_below_the_shard(src, tmp_path):
    """--on-error skip: the bad episode is left out exactly as the one-writer path leaves it
    out; fail: one error naming the file, no shard and no index left."""
    import shutil

    bad = tmp_path / "ds"
    shutil.copytree(src, bad)
    video = bad / "videos/chunk-000/observation.images.top/episode_000002.mp4"
    video.write_bytes(b"\x00junk" * 500)
    ref, split = tmp_path / "ref", tmp_path / "split"
    convert(bad, ref, ConvertConfig(workers=1, on_error="skip", progress=False))
    convert(bad, split, ConvertConfig(workers=2, on_error="skip", progress=False))
    assert tree_bytes(split) == tree_bytes(ref)

    failed = tmp_path / "failed"
    with pytest.raises(SourceError, match="episode_000002.mp4"):
        convert(bad, failed, ConvertConfig(workers=2, progress=False))
    names = [p.name for p in failed.rglob("*")]
    assert "index.json" not in names and not any(n.endswith(".tar") or n.endswith(".tmp") or n.endswith(".part")
                                                 for n in names), names


@pytest.mark.timeout(120)
def test_dead_worker_below_the_shard_stops_and_rerun_resumes(src, one_writer, tmp_path, monkeypatch):
    """A worker SIGKILLed while converting an episode below the shard: the run stops with one
    error naming the shard, leaves no shard, part or .tmp file; the rerun gives the one-writer bytes."""
    import signal

    from datakit.errors import DatakitError

    real = local_split.write_part

    def dying(spec, cfg, scratch, shard, ref, *progress):
        if ref.episode_index == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(spec, cfg, scratch, shard, ref, *progress)

    monkeypatch.setattr(local_split, "write_part", dying)
    monkeypatch.setenv("DATAKIT_MP_START", "fork")
    out = tmp_path / "out"
    with pytest.raises(DatakitError, match="worker process died.*shard 0 \\(episodes 0-3\\)"):
        convert(src, out, ConvertConfig(workers=2, progress=False))
    names = [p.name for p in out.rglob("*")]
    assert not any(n.endswith(".tar") or n.endswith(".tmp") or n.endswith(".part") for n in names), names
    monkeypatch.setattr(local_split, "write_part", real)
    convert(src, out, ConvertConfig(workers=2, progress=False))
    assert tree_bytes(out) == tree_bytes(one_writer)

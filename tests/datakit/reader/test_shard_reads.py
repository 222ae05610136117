"""Shard access of both readers (ShardReader and the loader): verify="sha256" catches a flipped
byte that the default size check cannot see; open shards stay within a bounded LRU (also under
a lowered RLIMIT_NOFILE); a kernel's short preadv is continued, not reported as truncation.

Oracles: stock `tarfile` + `np.load` of each frame's member, numpy slices of the file bytes,
and the untouched copy of the folder.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.errors import ShardError
from datakit.loader import LoaderConfig, ShardDataset
from datakit.loader.reads import ReadPlan, preadv_full, read_frames
from datakit.reader import open_shards
from datakit.shards.index import ShardEntry
from datakit.shards.open_files import OpenShards
from datakit.synth import make_lerobot_dataset
from damage import MANIFEST, copy_out, read_table
from loader_fixtures import CAMS, shards_rgb  # noqa: F401

NUM_EPISODES = 12
CAM = "observation.images.top"


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> Path:
    """12 one-episode shards of 3 tiny frames: more shards than the LRU bounds below."""
    root = tmp_path_factory.mktemp("many")
    src = make_lerobot_dataset(root / "src", episode_lengths=(3,) * NUM_EPISODES, height=32, width=64,
                               cameras=(CAM,), blank_cameras=())
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=1))
    assert len(json.loads((out / MANIFEST).read_text())["shards"]) == NUM_EPISODES
    return out


def _tar_frames(out: Path, cam: str) -> dict[tuple[int, int], np.ndarray]:
    """Oracle: every frame of `cam`, read with stock tarfile + np.load from every shard."""
    frames = {}
    for s in json.loads((out / MANIFEST).read_text())["shards"]:
        with tarfile.open(out / s["name"]) as tf:
            for m in tf:
                if m.name.endswith(f".{cam}.npy"):
                    ep, fr = m.name.split(".", 1)[0].split("/")
                    frames[int(ep), int(fr)] = np.load(io.BytesIO(tf.extractfile(m).read()))
    return frames


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _flip_byte_of_row(out: Path, row: int, cam: str) -> str:
    """Flip one pixel byte of `row`'s frame in place (the shard keeps its size); returns the shard."""
    t = read_table(out)
    name = json.loads((out / MANIFEST).read_text())["shards"][int(t.column("shard")[row].as_py())]["name"]
    off = int(t.column("offset/" + cam)[row].as_py())
    with open(out / name, "r+b") as f:
        b = os.pread(f.fileno(), 1, off + 7)
        os.pwrite(f.fileno(), bytes([b[0] ^ 0x10]), off + 7)
    return name


# --- verify="size" vs "sha256" (section 6) -------------------------------------------------------
def test_flipped_byte_is_caught_with_sha256_and_not_without(shards_rgb, tmp_path):
    out = copy_out(shards_rgb, tmp_path / "out")
    name = _flip_byte_of_row(out, 2, CAMS[0])
    ep0 = open_shards(shards_rgb).index.episodes[0].episode_index
    want = _tar_frames(shards_rgb, CAMS[0])[ep0, 2]

    got = open_shards(out).read_frame(ep0, 2, CAMS[0])  # default: size only, silently wrong
    assert (got != want).sum() == 1
    with pytest.raises(ShardError, match=f"{name}.*sha256"):
        open_shards(out, verify="sha256").read_frame(ep0, 0, CAMS[0])  # any frame of that shard

    rows = list(range(4))  # anchors 0..3: episode 0, shard 0
    ShardDataset(out, LoaderConfig(shuffle="sequential")).read_batch(rows)
    with pytest.raises(ShardError, match=f"{name}.*sha256"):
        ShardDataset(out, LoaderConfig(shuffle="sequential", verify="sha256")).read_batch(rows)


def test_sha256_is_checked_once_per_shard_per_process(many_shards, monkeypatch):
    import datakit.shards.open_files as sc

    hashed = []
    real = sc.fd_sha256
    monkeypatch.setattr(sc, "fd_sha256", lambda fd: hashed.append(fd) or real(fd))
    r = open_shards(many_shards, verify="sha256", max_open=2)
    eps = [e.episode_index for e in r.index.episodes]
    for _ in range(3):  # every shard evicted and reopened twice
        for e in eps:
            r.read_frame(e, 1, CAM)
    assert len(hashed) == NUM_EPISODES


# --- bounded open shards (section 7) -------------------------------------------------------------
def test_reader_keeps_at_most_max_open_shards_open(many_shards):
    want = _tar_frames(many_shards, CAM)
    r = open_shards(many_shards, max_open=3)
    base = _open_fds()
    for _ in range(2):
        for (ep, fr), frame in sorted(want.items()):
            np.testing.assert_array_equal(r.read_frame(ep, fr, CAM), frame)
            assert r.files.num_open <= 3
    # each open shard holds a descriptor and its memory map's duplicate
    assert _open_fds() <= base + 2 * 3
    r.close()


def test_loader_keeps_at_most_max_open_shards_open(many_shards):
    want = _tar_frames(many_shards, CAM)
    ds = ShardDataset(many_shards, LoaderConfig(shuffle="sequential", max_open_shards=2))
    base = _open_fds()
    for start in range(0, len(ds), 5):
        b = ds.read_batch(list(range(start, min(start + 5, len(ds)))))
        for i in range(b["row"].numel()):
            ep, fr = int(b["episode_index"][i]), int(b["frame_index"][i])
            np.testing.assert_array_equal(b["images"][i, 0, 0].numpy(), want[ep, fr])
        assert ds.files.num_open <= 2
    assert _open_fds() <= base + 2


@pytest.mark.timeout(120)
def test_readers_work_under_a_low_open_file_limit(many_shards):
    """With RLIMIT_NOFILE a few descriptors above what is open, both readers read all 12
    shards (each bounded at 2 open) and a limit too low gives a clear error, not EMFILE."""
    script = textwrap.dedent(f"""
        import os, resource, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from datakit.reader import open_shards
        from datakit.loader import LoaderConfig, ShardDataset
        from datakit.errors import ResourceLimitError
        out = {str(many_shards)!r}
        r = open_shards(out, max_open=2)
        ds = ShardDataset(out, LoaderConfig(shuffle="sequential", max_open_shards=2))
        n = len(os.listdir("/proc/self/fd"))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 7, hard))
        for _ in range(2):
            for e in r.index.episodes:
                for f in range(e.length):
                    r.read_frame(e.episode_index, f, {CAM!r})
            for s in range(0, len(ds), 4):
                ds.read_batch(list(range(s, min(s + 4, len(ds)))))
        r.close(); ds.files.close()
        greedy = open_shards(out, max_open=64)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 3, hard))
        try:
            for e in greedy.index.episodes:
                greedy.read_frame(e.episode_index, 0, {CAM!r})
        except ResourceLimitError as e:
            print("LIMIT:", e)
        print("OK")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "OK" in p.stdout
    assert "LIMIT:" in p.stdout and "too many open files" in p.stdout and "max_open_shards" in p.stdout


# --- short reads (section 7) ---------------------------------------------------------------------
def _short_preadv(monkeypatch, cap: int):
    """os.preadv that moves at most `cap` bytes per call, as Linux does past 0x7ffff000."""
    real = os.preadv
    calls = []

    def fake(fd, buffers, offset):
        left, part = cap, []
        for b in buffers:
            if left <= 0:
                break
            mv = memoryview(b).cast("B")
            part.append(mv[: min(len(mv), left)])
            left -= len(part[-1])
        calls.append(offset)
        return real(fd, part, offset)

    monkeypatch.setattr(os, "preadv", fake)
    return calls


def test_short_preadv_is_continued_not_reported_as_truncation(tmp_path, monkeypatch):
    data = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    (tmp_path / "shard-000000.tar").write_bytes(data.tobytes())
    # a finished folder's last file (OpenShards compares it at each open: OUT not rewritten meanwhile)
    (tmp_path / "checksums.json").write_text(json.dumps({"sha256": {"index.json": "0" * 64, "frames.arrow": "0" * 64}}))
    files = OpenShards(tmp_path, [ShardEntry("shard-000000.tar", data.size, "0" * 64, [0, 0], [0, 1], 1)])
    fb = 1000
    offsets = np.array([0, 1000, 2000, 5000, 5500, 9000, 150_000, 199_000, 7000], np.int64)  # runs with gaps
    dest = [np.zeros(fb, np.uint8) for _ in offsets]
    plan = ReadPlan(shard=np.zeros(offsets.size, np.int64), offset=offsets,
                    dest=[memoryview(d) for d in dest], owner=np.arange(offsets.size))
    calls = _short_preadv(monkeypatch, cap=777)
    assert read_frames(files, plan, fb, coalesce_gap=4096) == {}
    assert len(calls) > offsets.size  # every run needed several calls
    for o, d in zip(offsets, dest):
        np.testing.assert_array_equal(d, data[o : o + fb])


def test_preadv_full_stops_at_end_of_file(tmp_path):
    (tmp_path / "f").write_bytes(bytes(range(100)))
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        a, b = bytearray(60), bytearray(60)
        assert preadv_full(fd, [memoryview(a), memoryview(b)], 0) == 100
        assert bytes(a) == bytes(range(60)) and bytes(b[:40]) == bytes(range(60, 100))
    finally:
        os.close(fd)


def test_loader_batch_with_short_reads_equals_the_tar_members(shards_rgb, monkeypatch):
    want = _tar_frames(shards_rgb, CAMS[0])
    ds = ShardDataset(shards_rgb, LoaderConfig(shuffle="sequential", slots=(CAMS[0],), frame_offsets=(-3, -1, 0),
                                               coalesce_gap=1 << 30))
    _short_preadv(monkeypatch, cap=4099)
    b = ds.read_batch(list(range(0, len(ds), 3)))
    for i in range(b["row"].numel()):
        ep, fr = int(b["episode_index"][i]), int(b["frame_index"][i])
        for t, off in enumerate((-3, -1, 0)):  # windows clamp to the episode's first frame
            np.testing.assert_array_equal(b["images"][i, 0, t].numpy(), want[ep, max(fr + off, 0)])


@pytest.mark.timeout(120)
def test_workers_with_sha256_and_one_open_shard_equal_the_tar_members(many_shards):
    """DataLoader workers (forked) each keep their own bounded, verified cache."""
    from datakit.loader import ShardLoader

    want = _tar_frames(many_shards, CAM)
    cfg = LoaderConfig(batch_size=4, num_workers=2, verify="sha256", max_open_shards=1, seed=3)
    loader = ShardLoader(many_shards, cfg)
    seen = 0
    for b in loader:
        for i in range(b["row"].numel()):
            ep, fr = int(b["episode_index"][i]), int(b["frame_index"][i])
            np.testing.assert_array_equal(b["images"][i, 0, 0].numpy(), want[ep, fr])
            seen += 1
    loader.close()
    assert seen == (len(want) // 4) * 4


@pytest.mark.timeout(120)
def test_a_bad_shard_in_a_worker_raises_its_own_one_line_error(many_shards, tmp_path):
    """Not the DataLoader's RuntimeError wrapping a worker traceback."""
    from datakit.loader import ShardLoader

    out = copy_out(many_shards, tmp_path / "out")
    name = json.loads((out / MANIFEST).read_text())["shards"][3]["name"]
    (out / name).unlink()
    loader = ShardLoader(out, LoaderConfig(batch_size=4, num_workers=2, shuffle="sequential"))
    with pytest.raises(ShardError) as err:
        for _ in loader:
            pass
    loader.close()
    assert str(err.value) == f"{out / name}: missing shard file"

"""Shards on object storage, against a real S3-compatible server (moto, real HTTP, via s3fs):
upload in commit order, a cache smaller than the dataset, killed downloads, transient server
errors, and two processes filling one cache. The oracle for frame bytes is the local folder
read with the stock `tarfile` module and `numpy.load`."""
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from storage_fixtures import CAMS  # the fixtures (s3_server, bucket, converted) come from conftest.py

pytest.importorskip("s3fs")

from datakit.errors import StorageError  # noqa: E402
from datakit.shards.index import FRAME_KEY, OFFSET_PREFIX, column, load_frames, load_index  # noqa: E402
from datakit.storage import cache as cache_mod  # noqa: E402
from datakit.storage import transfer  # noqa: E402
from datakit.storage.cache import ShardCache  # noqa: E402
from datakit.storage.retry import RetryPolicy  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


def _remote_names(url: str) -> set[str]:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1] for p in fs.ls(url[len("s3://"):])}


def _oracle_frames(out: Path) -> dict[tuple[int, str], np.ndarray]:
    """Every stored frame of the local folder, by (row, camera), through stock tarfile + np.load."""
    index, frames = load_index(out), load_frames(out)
    ep, fr = column(frames, "episode_index"), column(frames, "frame_index")
    key_row = {FRAME_KEY.format(episode=int(e), frame=int(f)): r for r, (e, f) in enumerate(zip(ep, fr))}
    want = {}
    for entry in index.shards:
        with tarfile.open(out / entry.name) as tf:
            for m in tf:
                key, _, field = m.name.partition(".")
                if field.removesuffix(".npy") in CAMS and field.endswith(".npy"):
                    want[(key_row[key], field.removesuffix(".npy"))] = np.load(io.BytesIO(tf.extractfile(m).read()))
    return want


@pytest.fixture
def uploaded(converted, bucket) -> str:
    url = f"{bucket}/ds"
    transfer.upload_output(converted, url, policy=FAST)
    return url


@pytest.mark.timeout(120)
def test_upload_puts_shards_first_and_checksums_last(converted, bucket, monkeypatch):
    order, real = [], transfer.upload
    monkeypatch.setattr(transfer, "upload", lambda local, url, **kw: (order.append(Path(local).name),
                                                                       real(local, url, **kw)))
    url = f"{bucket}/ds"
    transfer.upload_output(converted, url, policy=FAST)
    shards = [s.name for s in load_index(converted).shards]
    assert order == shards + ["frames.arrow", "index.json", "checksums.json"]
    assert _remote_names(url) == set(order)
    # a rerun finds every shard there and uploads only the index files again
    order.clear()
    transfer.upload_output(converted, url, policy=FAST)
    assert order == ["frames.arrow", "index.json", "checksums.json"]


@pytest.mark.timeout(120)
def test_failed_upload_leaves_no_index(converted, bucket, monkeypatch):
    real, calls = transfer.upload, []

    def failing(local, url, **kw):
        calls.append(Path(local).name)
        if len(calls) == 2:
            raise PermissionError(f"{url}: access denied")
        return real(local, url, **kw)

    monkeypatch.setattr(transfer, "upload", failing)
    with pytest.raises(PermissionError):
        transfer.upload_output(converted, f"{bucket}/ds", policy=FAST)
    names = _remote_names(f"{bucket}/ds")
    assert names == {calls[0]}  # the first shard only: no index names a missing shard
    with pytest.raises(StorageError, match="not a finished conversion"):
        ShardCache(f"{bucket}/ds", converted.parent / "c0", max_bytes=1 << 30)


@pytest.mark.timeout(180)
def test_cache_smaller_than_dataset_evicts_and_reads_every_frame_right(converted, uploaded, tmp_path, monkeypatch):
    index, frames = load_index(converted), load_frames(converted)
    total, largest = sum(s.bytes for s in index.shards), max(s.bytes for s in index.shards)
    max_bytes = 2 * largest
    assert max_bytes < total
    downloads = []
    real = cache_mod.download
    monkeypatch.setattr(cache_mod, "download", lambda url, *a, **kw: (downloads.append(url), real(url, *a, **kw))[1])
    cache = ShardCache(uploaded, tmp_path / "cache", max_bytes=max_bytes, verify="sha256", policy=FAST)
    # index files fetched into the cache folder, readable as a converted folder
    assert load_index(cache.folder).to_json() == index.to_json()
    shard, fb = column(frames, "shard"), {c: index.cameras[c].frame_bytes for c in CAMS}
    offsets = {c: column(frames, OFFSET_PREFIX + c) for c in CAMS}
    want = _oracle_frames(converted)
    rng = np.random.default_rng(0)
    for row in rng.permutation(len(shard)).tolist():
        for cam in CAMS:
            fd = cache.open(index.shards[int(shard[row])])
            try:
                got = os.pread(fd, fb[cam], int(offsets[cam][row]))
            finally:
                os.close(fd)
            assert np.array_equal(np.frombuffer(got, np.uint8).reshape(want[(row, cam)].shape), want[(row, cam)])
            assert cache.cached_bytes() <= max_bytes
    shard_downloads = [u for u in downloads if u.endswith(".tar")]
    assert len(shard_downloads) > len(index.shards)  # evicted shards were fetched again
    assert not list(cache.folder.glob("*.tmp"))


_SLOW_DOWNLOAD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from datakit.storage import transfer, cache
    def stuck(fs, rpath, out, expected, *rest):
        out.write(b"x" * 4096); out.flush()
        print("PARTIAL", flush=True)
        time.sleep(600)
    c = cache.ShardCache({url!r}, {cache_dir!r}, max_bytes=1 << 30)
    transfer._stream_to = stuck  # after the index files: the shard download hangs half-way
    c.local_path(c.index.shards[1])
""")


@pytest.mark.timeout(120)
def test_download_killed_midway_is_cleaned_and_refetched(converted, uploaded, tmp_path):
    cache_dir = tmp_path / "cache"
    code = _SLOW_DOWNLOAD.format(repo=str(REPO), url=uploaded, cache_dir=str(cache_dir))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "PARTIAL"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    cache = ShardCache(uploaded, cache_dir, max_bytes=1 << 30, verify="size", policy=FAST)
    entry = cache.index.shards[1]
    partial = list(cache.folder.glob(f"{entry.name}.*.tmp"))
    assert partial and partial[0].stat().st_size == 4096 and not (cache.folder / entry.name).exists()
    # a second stale temp, of another shard, as a killed writer would leave it
    stale_other = cache.folder / f"{cache.index.shards[2].name}.999999.tmp"
    stale_other.write_bytes(b"garbage")
    path = cache.local_path(entry)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256
    assert not list(cache.folder.glob("*.tmp"))  # both temps cleaned


@pytest.mark.timeout(120)
def test_transient_errors_are_retried_with_backoff_then_fail_clearly(converted, uploaded, tmp_path, monkeypatch):
    import s3fs

    real_open, failures = s3fs.S3FileSystem._open, {"left": 2}

    def flaky(self, path, *a, **kw):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise ConnectionError("Connection reset by peer")
        return real_open(self, path, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_open", flaky)
    sleeps = []
    policy = RetryPolicy(attempts=4, base_delay=0.01, max_delay=1.0, jitter=0.0, sleep=sleeps.append)
    cache = ShardCache(uploaded, tmp_path / "cache", max_bytes=1 << 30, policy=policy)
    # the index files were fetched through the two failures
    assert sleeps == [0.01, 0.02]
    entry = cache.index.shards[0]
    assert hashlib.sha256(cache.local_path(entry).read_bytes()).hexdigest() == entry.sha256
    # a server that keeps failing: 4 attempts, delays doubling, then one error naming the URL
    sleeps.clear()
    failures["left"] = 10**6
    with pytest.raises(StorageError, match=rf"{uploaded}/shard-000001.tar: download failed 4 times"):
        cache.local_path(cache.index.shards[1])
    assert sleeps == [0.01, 0.02, 0.04]
    assert not list(cache.folder.glob("*.tmp")) and not (cache.folder / cache.index.shards[1].name).exists()


@pytest.mark.timeout(60)
def test_missing_object_is_not_retried(uploaded, tmp_path):
    sleeps = []
    policy = RetryPolicy(attempts=4, base_delay=0.01, sleep=sleeps.append)
    with pytest.raises(FileNotFoundError):
        transfer.download(f"{uploaded}/no-such-shard.tar", tmp_path / "x", policy=policy)
    assert sleeps == [] and not list(tmp_path.iterdir())


_FILLER = textwrap.dedent("""
    import hashlib, os, sys
    sys.path.insert(0, {repo!r})
    from datakit.storage.cache import ShardCache
    c = ShardCache({url!r}, {cache_dir!r}, max_bytes={max_bytes})
    order = {order!r}
    for k in order * 3:
        e = c.index.shards[k]
        fd = c.open(e)
        try:
            data = os.pread(fd, e.bytes + 1, 0)
        finally:
            os.close(fd)
        assert hashlib.sha256(data).hexdigest() == e.sha256, (k, len(data))
    print("OK", flush=True)
""")


@pytest.mark.timeout(180)
def test_two_processes_fill_one_cache_without_corrupting_it(converted, uploaded, tmp_path):
    index = load_index(converted)
    largest = max(s.bytes for s in index.shards)
    max_bytes = 2 * largest + largest // 2  # below the dataset: both processes evict all the time
    assert max_bytes < sum(s.bytes for s in index.shards)
    cache_dir = tmp_path / "cache"
    n = len(index.shards)
    orders = [list(range(n)), list(reversed(range(n)))]
    procs = [subprocess.Popen([sys.executable, "-c", _FILLER.format(repo=str(REPO), url=uploaded,
                                                                   cache_dir=str(cache_dir), max_bytes=max_bytes,
                                                                   order=o)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for o in orders]
    outs = [p.communicate(timeout=150) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "OK", err[-2000:]
    cache = ShardCache(uploaded, cache_dir, max_bytes=max_bytes)
    assert not list(cache.folder.glob("*.tmp"))
    by_name = {s.name: s for s in index.shards}
    kept = [p for p in cache.folder.iterdir() if p.name in by_name]
    assert kept and sum(p.stat().st_size for p in kept) <= max_bytes
    for p in kept:
        assert hashlib.sha256(p.read_bytes()).hexdigest() == by_name[p.name].sha256


@pytest.mark.timeout(120)
def test_downloads_stay_ahead_of_the_reader_within_its_budget(converted, uploaded, tmp_path):
    index = load_index(converted)
    largest = max(s.bytes for s in index.shards)
    cache = ShardCache(uploaded, tmp_path / "cache", max_bytes=4 * largest, ahead_bytes=2 * largest, policy=FAST)
    plan = [3, 3, 1, 0, 2]
    budget_prefix = []  # the shards of the plan that fit the budget from position 0
    total = 0
    for s in dict.fromkeys(plan):
        total += index.shards[s].bytes
        if total > 2 * largest and budget_prefix:
            break
        budget_prefix.append(s)

    def present() -> set[int]:
        return {i for i, s in enumerate(index.shards) if (cache.folder / s.name).exists()}

    cache.download_ahead(plan)
    deadline = time.time() + 30
    while present() != set(budget_prefix) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # nothing beyond the budget arrives while the reader stays put
    assert present() == set(budget_prefix)
    for s in plan:  # the reader moves on: the rest of the plan is fetched ahead of it
        fd = cache.open(index.shards[s])
        os.close(fd)
    deadline = time.time() + 30
    while present() != set(plan) and time.time() < deadline:
        time.sleep(0.02)
    assert present() == set(plan)
    cache.close()
    assert cache.download_errors == []


@pytest.mark.timeout(60)
def test_sha256_mismatch_is_refused_and_never_cached(converted, uploaded, tmp_path):
    import s3fs

    cache = ShardCache(uploaded, tmp_path / "cache", max_bytes=1 << 30, verify="sha256", policy=FAST)
    entry = cache.index.shards[0]
    good = (converted / entry.name).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, one flipped byte: only the hash can tell
    s3fs.S3FileSystem().pipe(f"{uploaded}/{entry.name}"[len("s3://"):], bytes(bad))
    with pytest.raises(Exception, match=r"sha256 .* differs from the index"):
        cache.local_path(entry)
    assert not (cache.folder / entry.name).exists() and not list(cache.folder.glob("*.tmp"))


@pytest.mark.timeout(60)
def test_fetch_source_files_from_s3_to_scratch(converted, bucket, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem()
    names = ["meta/info.json", "videos/chunk-000/cam/episode_000000.mp4"]
    blobs = {n: os.urandom(50_000 + i) for i, n in enumerate(names)}
    for n, data in blobs.items():
        fs.pipe(f"{bucket}/src/{n}"[len("s3://"):], data)
    got = transfer.fetch(f"{bucket}/src", names, tmp_path / "scratch", policy=FAST)
    assert got == [tmp_path / "scratch" / n for n in names]
    assert [p.read_bytes() for p in got] == [blobs[n] for n in names]
    with pytest.raises(StorageError, match=rf"{bucket}/src/meta/missing.json: no such file"):
        transfer.fetch(f"{bucket}/src", ["meta/missing.json"], tmp_path / "scratch", policy=FAST)


@pytest.fixture
def flaky(s3_server):
    from flaky_proxy import FlakyProxy

    proxy = FlakyProxy(s3_server)
    yield proxy
    proxy.close()


@pytest.mark.timeout(120)
def test_server_errors_over_http_are_retried_then_fail_clearly(converted, uploaded, tmp_path, flaky):
    """503 SlowDown answers from a real HTTP endpoint (a proxy before the S3 server); botocore's
    own retries are switched off so that ours are the ones tested."""
    opts = {"endpoint_url": flaky.url, "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
    sleeps = []
    policy = RetryPolicy(attempts=4, base_delay=0.01, max_delay=1.0, jitter=0.0, sleep=sleeps.append)
    cache = ShardCache(uploaded, tmp_path / "cache", max_bytes=1 << 30, storage_options=opts, policy=policy)
    entry = cache.index.shards[2]
    flaky.fail_next(3, entry.name)  # an error for a while, then the server recovers
    assert hashlib.sha256(cache.local_path(entry).read_bytes()).hexdigest() == entry.sha256
    assert flaky.failed == 3
    sleeps.clear()
    flaky.fail_next(10**6, cache.index.shards[3].name)  # an error that does not go away
    t0 = time.time()
    with pytest.raises(StorageError, match=rf"^{uploaded}/{cache.index.shards[3].name}: download failed 4 times"):
        cache.local_path(cache.index.shards[3])
    assert sleeps == [0.01, 0.02, 0.04] and time.time() - t0 < 60
    assert not list(cache.folder.glob("*.tmp"))


@pytest.mark.timeout(60)
def test_plan_reads_a_remote_index_like_a_local_one(converted, uploaded, capsys):
    import argparse

    from datakit.commands.plan.command import add_parser, run

    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="command"))
    docs = []
    for root in (str(converted), uploaded):
        assert run(ap.parse_args(["plan", root, "--samples-per-s", "500", "--ranks", "2", "--batch-size", "4",
                                  "--shuffle", "shard_block", "--json"])) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0] == docs[1]
    with pytest.raises(ValueError, match="needs a local folder"):
        run(ap.parse_args(["plan", uploaded, "--samples-per-s", "500", "--measure"]))


@pytest.mark.timeout(120)
def test_shard_uploader_overlaps_shards_and_puts_the_index_last(converted, bucket, monkeypatch):
    from datakit.storage import uploader as uploader_mod

    order, real = [], transfer.upload

    def recording(local, url, **kw):
        names = _remote_names(url.rsplit("/", 1)[0]) if Path(local).suffix != ".tar" else set()
        order.append((Path(local).name, names))
        return real(local, url, **kw)

    monkeypatch.setattr(uploader_mod, "upload", recording)
    monkeypatch.setattr(transfer, "upload", recording)
    shards = [s.name for s in load_index(converted).shards]
    up = uploader_mod.ShardUploader(f"{bucket}/ds", policy=FAST)
    for name in shards:  # as the converter commits them
        up.shard_committed(converted / name)
    assert up.finish(converted) == shards + ["frames.arrow", "index.json", "checksums.json"]
    assert [n for n, _ in order] == shards + ["frames.arrow", "index.json", "checksums.json"]
    for name, present in order[len(shards):]:  # each index file went up over every shard
        assert set(shards) <= present
    assert _remote_names(f"{bucket}/ds") == set(shards) | {"frames.arrow", "index.json", "checksums.json"}


@pytest.mark.timeout(120)
def test_shard_uploader_failure_stops_before_the_index(converted, bucket, monkeypatch):
    from datakit.storage import uploader as uploader_mod

    def refuse(local, url, **kw):
        raise PermissionError(f"{url}: access denied")

    monkeypatch.setattr(uploader_mod, "upload", refuse)
    up = uploader_mod.ShardUploader(f"{bucket}/ds", policy=FAST)
    up.shard_committed(converted / load_index(converted).shards[0].name)
    with pytest.raises(PermissionError, match="access denied"):
        up.finish(converted)
    assert _remote_names(bucket) == set()  # nothing at all under the bucket: no index

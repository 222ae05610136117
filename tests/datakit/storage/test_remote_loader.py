"""The loader and ShardReader on an s3:// shard root, against a real S3-compatible server (moto,
real HTTP, via s3fs): a cache smaller than the dataset, downloads ahead of the sampler, a server
that fails for a while, a download killed mid-way. The oracle is the same loader on the local
copy of the folder, compared with numpy bit for bit, and stock tarfile + np.load for frames."""
import io
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from storage_fixtures import CAMS  # the fixtures (s3_server, bucket, converted, uploaded) come from conftest.py

pytest.importorskip("s3fs")

from datakit.errors import StorageError  # noqa: E402
from datakit.loader import LoaderConfig, ShardLoader  # noqa: E402
from datakit.reader import open_shards  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402
from datakit.storage import cache as cache_mod  # noqa: E402
from datakit.storage import roots  # noqa: E402
from datakit.storage.retry import RetryPolicy  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, jitter=0.0)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(roots, "DEFAULT_RETRY", FAST)


def _cfg(**kw) -> LoaderConfig:
    base = dict(batch_size=4, frame_offsets=(-2, 0), action_horizon=3, shuffle="shard_block", block_size=8,
                seed=3, pin_memory=False)
    return LoaderConfig(**{**base, **kw})


def _batches(root, cfg: LoaderConfig, n: int) -> list[dict[str, np.ndarray]]:
    loader = ShardLoader(root, cfg)
    try:
        out = []
        while len(out) < n:  # across epoch ends
            out += [{k: v.numpy().copy() for k, v in b.items()} for b in loader]
        return out[:n]
    finally:
        loader.close()


def _assert_same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype and np.array_equal(g[k], w[k]), (i, k)


def _small_cache(converted: Path) -> int:
    index = load_index(converted)
    largest, total = max(s.bytes for s in index.shards), sum(s.bytes for s in index.shards)
    size = 2 * largest
    assert size < total, "the fixture needs more shards for a cache smaller than the dataset"
    return size


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [0, 2])
def test_shard_loader_from_s3_with_a_small_cache_equals_the_local_loader(converted, uploaded, tmp_path,
                                                                         monkeypatch, workers):
    max_bytes = _small_cache(converted)
    shard_downloads = []
    real = cache_mod.download
    monkeypatch.setattr(cache_mod, "download", lambda url, *a, **kw: (
        shard_downloads.append(url) if url.endswith(".tar") else None, real(url, *a, **kw))[1])
    local = _cfg(num_workers=workers)
    remote = _cfg(num_workers=workers, cache_dir=str(tmp_path / "cache"), cache_bytes=max_bytes)
    steps = 2 * ShardLoader(converted, local).sampler.steps_per_epoch + 1  # two epochs and a bit
    want = _batches(converted, local, steps)
    got = _batches(uploaded, remote, steps)
    _assert_same(got, want)
    # the images themselves against stock tarfile + np.load of the local shards
    frames = _tar_frames(converted)
    b = got[0]
    for i in range(b["row"].shape[0]):
        ep, fr = int(b["episode_index"][i]), int(b["frame_index"][i])
        for j, slot in enumerate(b["slot_index"].tolist()):
            cam = CAMS[slot]
            assert np.array_equal(b["images"][i, j, -1], frames[(ep, fr, cam)])
    if workers == 0:  # downloads in worker processes are not seen by this process's monkeypatch
        assert len(shard_downloads) > len(load_index(converted).shards)  # evicted, fetched again
    cache = cache_mod.ShardCache(uploaded, tmp_path / "cache", max_bytes=max_bytes)
    assert cache.cached_bytes() <= max_bytes and not list(cache.folder.glob("*.tmp"))


def _tar_frames(out: Path) -> dict[tuple[int, int, str], np.ndarray]:
    """(episode, frame, camera) -> stored frame, read with stock tarfile + np.load."""
    want = {}
    for entry in load_index(out).shards:
        with tarfile.open(out / entry.name) as tf:
            for m in tf:
                key, _, field = m.name.partition(".")
                cam = field.removesuffix(".npy")
                if cam in CAMS:
                    ep, fr = (int(x) for x in key.split("/"))  # FRAME_KEY: episode/frame
                    want[(ep, fr, cam)] = np.load(io.BytesIO(tf.extractfile(m).read()))
    return want


@pytest.mark.timeout(120)
def test_downloads_run_ahead_of_the_sampler(converted, uploaded, tmp_path):
    """Before the next batch is asked for, the shard it starts in is already downloaded by the
    download thread (the reader has not opened it): the plan follows the sampler's order."""
    index = load_index(converted)
    largest = max(s.bytes for s in index.shards)
    cfg = _cfg(cache_dir=str(tmp_path / "cache"), cache_bytes=4 * largest, block_size=4)
    loader = ShardLoader(uploaded, cfg)
    try:
        ds, s = loader.dataset, loader.sampler
        first_shard = ds.shard[ds.anchors[s.batches(0)[:, 0]]]
        it = iter(loader)
        next(it)
        waited = 0
        for step in range(1, s.steps_per_epoch):
            name = index.shards[int(first_shard[step])].name
            if first_shard[step] != first_shard[step - 1]:  # a new shard: it must arrive unasked
                deadline = time.time() + 20
                while not (ds.cache.folder / name).exists() and time.time() < deadline:
                    time.sleep(0.01)
                assert (ds.cache.folder / name).exists(), f"step {step}: {name} was not downloaded ahead"
                waited += 1
            next(it)
        assert waited >= 2 and ds.cache.download_errors == []
    finally:
        loader.close()


@pytest.fixture
def flaky(s3_server):
    from flaky_proxy import FlakyProxy

    proxy = FlakyProxy(s3_server)
    yield proxy
    proxy.close()


@pytest.mark.timeout(180)
def test_loader_retries_a_server_that_fails_for_a_while_then_fails_clearly(converted, uploaded, tmp_path,
                                                                           flaky):
    opts = {"endpoint_url": flaky.url, "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
    local = _cfg()
    want = _batches(converted, local, 6)
    flaky.fail_next(3, ".tar")  # 503 SlowDown for the first three shard requests, then fine
    remote = _cfg(cache_dir=str(tmp_path / "c1"), cache_bytes=1 << 30, storage_options=opts)
    _assert_same(_batches(uploaded, remote, 6), want)
    assert flaky.failed == 3
    flaky.fail_next(10**6, ".tar")  # a server that does not recover
    # a small cache keeps the download window (and its failing downloads) to about one shard
    loader = ShardLoader(uploaded, _cfg(cache_dir=str(tmp_path / "c2"), cache_bytes=_small_cache(converted),
                                        storage_options=opts))
    try:
        with pytest.raises(StorageError, match=rf"^{uploaded}/shard-\d+\.tar: download failed 4 times"):
            next(iter(loader))
    finally:
        loader.close()


_KILLED_LOADER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from datakit.loader import LoaderConfig, ShardLoader
    from datakit.storage import transfer
    real = transfer._stream_to
    def stuck(fs, rpath, out, expected, *rest):
        if not rpath.endswith(".tar"):
            return real(fs, rpath, out, expected, *rest)
        out.write(b"x" * 4096); out.flush()
        print("PARTIAL", flush=True)
        time.sleep(600)
    transfer._stream_to = stuck  # the first shard download hangs half-way
    cfg = LoaderConfig(**{cfg!r})
    next(iter(ShardLoader({url!r}, cfg)))
""")


@pytest.mark.timeout(180)
def test_loader_after_a_download_killed_midway_refetches_the_shard(converted, uploaded, tmp_path):
    kw = dict(batch_size=4, frame_offsets=(-2, 0), action_horizon=3, shuffle="shard_block", block_size=8, seed=3,
              pin_memory=False, cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30)
    p = subprocess.Popen([sys.executable, "-c", _KILLED_LOADER.format(repo=str(REPO), url=uploaded, cfg=kw)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "PARTIAL"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    folders = [d for d in (tmp_path / "cache").glob("*/*") if d.is_dir()]
    assert len(folders) == 1
    partial = list(folders[0].glob("shard-*.tmp"))
    assert len(partial) == 1 and partial[0].stat().st_size == 4096
    name = partial[0].name.split(".")[0] + ".tar"
    assert not (folders[0] / name).exists()  # never under its final name half-written
    want = _batches(converted, _cfg(), 5)
    _assert_same(_batches(uploaded, _cfg(cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30), 5), want)
    assert not list(folders[0].glob("*.tmp"))
    assert (folders[0] / name).read_bytes() == (converted / name).read_bytes()


@pytest.mark.timeout(120)
def test_open_shards_on_s3_reads_the_frames_of_the_local_folder(converted, uploaded, tmp_path):
    frames = _tar_frames(converted)
    index = load_index(converted)
    reader = open_shards(uploaded, cache_dir=tmp_path / "cache", cache_bytes=_small_cache(converted),
                         verify="sha256", max_open=1)
    try:
        assert reader.root == uploaded
        rng = np.random.default_rng(1)
        eps = [(e.episode_index, e.length) for e in index.episodes]
        for _ in range(40):
            ep, length = eps[rng.integers(len(eps))]
            fr, cam = int(rng.integers(length)), CAMS[int(rng.integers(len(CAMS)))]
            assert np.array_equal(reader.read_raw(reader.row(ep, fr), cam), frames[(ep, fr, cam)])
    finally:
        reader.close()


@pytest.mark.timeout(120)
def test_loader_sha256_on_s3_names_a_damaged_shard_or_skips_its_samples(converted, bucket, tmp_path):
    import s3fs

    from datakit.errors import ShardError

    url = f"{bucket}/ds"
    fs = s3fs.S3FileSystem()
    for p in sorted(converted.iterdir()):
        fs.put_file(str(p), f"{url}/{p.name}"[len("s3://"):])
    index = load_index(converted)
    bad = 1
    data = bytearray((converted / index.shards[bad].name).read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the hash can tell
    fs.pipe(f"{url}/{index.shards[bad].name}"[len("s3://"):], bytes(data))
    remote = dict(cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30, verify="sha256")
    loader = ShardLoader(url, _cfg(**remote))
    try:
        with pytest.raises(ShardError, match=rf"^{url}/{index.shards[bad].name}: sha256 .* differs from the index"):
            for _ in loader:
                pass
    finally:
        loader.close()
    loader = ShardLoader(url, _cfg(**remote, on_error="skip"))
    try:
        ds, s = loader.dataset, loader.sampler
        want_skipped = int((ds.shard[ds.anchors[s.batches(0)]] == bad).sum())  # the epoch's samples in it
        rows = np.concatenate([b["row"].numpy() for b in loader])
        assert want_skipped > 0 and loader.num_skipped == want_skipped
        assert not (ds.shard[rows] == bad).any()
        assert not list(ds.cache.folder.glob(f"{index.shards[bad].name}*"))  # never cached
    finally:
        loader.close()


@pytest.mark.timeout(120)
def test_remote_dataset_pickles_for_spawned_workers_without_the_prefetch_thread(converted, uploaded, tmp_path):
    import pickle

    cfg = _cfg(cache_dir=str(tmp_path / "cache"), cache_bytes=_small_cache(converted))
    loader = ShardLoader(uploaded, cfg)
    try:
        next(iter(loader))  # the main process's download thread is running now
        assert loader.dataset.cache._ahead._thread is not None
        copy = pickle.loads(pickle.dumps(loader.dataset))
        assert copy.cache is not loader.dataset.cache and copy.cache._ahead._thread is None
        assert copy.cache.folder == loader.dataset.cache.folder and copy.root == uploaded
        want = ShardLoader(converted, _cfg()).dataset.read_batch(list(range(0, len(copy), 7)))
        got = copy.read_batch(list(range(0, len(copy), 7)))
        _assert_same([{k: v.numpy() for k, v in got.items()}], [{k: v.numpy() for k, v in want.items()}])
        copy.close()
    finally:
        loader.close()

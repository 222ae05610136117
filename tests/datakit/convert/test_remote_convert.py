"""`datakit convert` with SRC or OUT on object storage: against the moto S3 server of
tests/fixtures/storage_fixtures.py (real HTTP through s3fs), with a local conversion of the same source
as the oracle (byte for byte, read back with stock s3fs and tarfile)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from datakit.cli import main
from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.synth import make_lerobot_dataset

ROOT = Path(__file__).resolve().parents[3]
SHARD = 150_000
FLAGS = ["--workers", "1", "--shard-size", str(SHARD), "--no-progress"]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_lerobot_dataset(tmp_path_factory.mktemp("rc") / "ds", version="v2.1", episode_lengths=(14, 17, 11, 15),
                                height=32, width=64, cameras=("observation.images.top", "observation.images.wrist"),
                                blank_cameras=())


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rc_ref") / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=SHARD))
    return out


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DATAKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _remote_files(url: str) -> dict[str, bytes]:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    base = url[len("s3://"):]
    return {p[len(base) + 1:]: fs.cat_file(p) for p in fs.find(base)}


def _local_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _without_fingerprint(index_json: bytes) -> dict:
    d = json.loads(index_json)
    d["source"].pop("fingerprint")
    return d


def test_convert_to_s3_equals_local_and_verifies(src, reference, bucket, cache, capsys):
    url = f"{bucket}/out"
    assert main(["convert", str(src), url, *FLAGS]) == 0
    remote, local = _remote_files(url), _local_files(reference)
    assert sorted(remote) == sorted(local)  # shards, frames.arrow, index.json, checksums.json; nothing else
    assert len([n for n in local if n.startswith("shard-")]) >= 3
    for name, data in local.items():
        assert remote[name] == data, name
    for name in (n for n in local if n.startswith("shard-")):  # stock tarfile reads the remote shard
        with tarfile.open(fileobj=io.BytesIO(remote[name])) as t:
            assert t.getnames() == tarfile.open(reference / name).getnames()
    assert not list((cache / "convert").glob("out-*")), "the local staging folder is deleted after upload"
    assert main(["verify", url]) == 0

    capsys.readouterr()
    assert main(["convert", str(src), url, *FLAGS]) == 0
    assert "already complete" in capsys.readouterr().out
    assert main(["convert", str(src), url, "--workers", "1", "--shard-size", "300000", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert url in err and "other options" in err and "cache" not in err


def test_same_size_foreign_shard_is_replaced(src, reference, bucket):
    """A remote shard of the right size that this machine did not upload is not trusted."""
    import s3fs

    url = f"{bucket}/out"
    size = (reference / "shard-000000.tar").stat().st_size
    s3fs.S3FileSystem().pipe_file(f"{url[5:]}/shard-000000.tar", b"\0" * size)
    s3fs.S3FileSystem().pipe_file(f"{url[5:]}/shard-000099.tar", b"stale")  # not in the index: removed
    assert main(["convert", str(src), url, *FLAGS]) == 0
    assert _remote_files(url) == _local_files(reference)


def test_remote_out_with_other_files_is_refused(src, bucket, capsys):
    import s3fs

    s3fs.S3FileSystem().pipe_file(f"{bucket[5:]}/out/notes.txt", b"mine")
    assert main(["convert", str(src), f"{bucket}/out", *FLAGS]) == 2
    assert f"{bucket}/out: holds other files (notes.txt)" in capsys.readouterr().err
    assert sorted(_remote_files(f"{bucket}/out")) == ["notes.txt"]


@pytest.mark.timeout(180)
def test_killed_conversion_to_s3_resumes(src, reference, bucket, cache):
    from datakit.convert.remote.run import _key

    url = f"{bucket}/out"
    journal = cache / "convert" / f"out-{_key(url)}" / "out" / ".datakit-staging" / "shard-000000.journal"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "datakit.cli", "convert", str(src), url, *FLAGS], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while p.poll() is None and not journal.exists() and time.time() - t0 < 120:
        time.sleep(0.005)
    killed = p.poll() is None
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert killed, "the conversion ended before its first shard was journaled"
    assert "checksums.json" not in _remote_files(url)

    s = convert(str(src), url, ConvertConfig(workers=1, progress=False, shard_size=SHARD))
    assert s.resumed_shards >= 1 and not s.already_complete
    assert _remote_files(url) == _local_files(reference)


def test_convert_from_s3_equals_local(src, reference, bucket, tmp_path, cache, capsys):
    import s3fs

    s3fs.S3FileSystem().put(str(src), f"{bucket[5:]}/sources/ds", recursive=True)
    out = tmp_path / "out"
    assert main(["convert", f"{bucket}/sources/ds", str(out), *FLAGS]) == 0
    got, want = _local_files(out), _local_files(reference)
    assert sorted(got) == sorted(want)
    for name in (n for n in want if n not in ("index.json", "checksums.json")):
        assert got[name] == want[name], name
    # the index differs only in the videos' mtimes (the fetched copies carry the objects' times)
    assert _without_fingerprint(got["index.json"]) == _without_fingerprint(want["index.json"])
    assert not list((cache / "convert").glob("src-*/ds")), "the fetched source is deleted once converted"

    capsys.readouterr()  # a rerun fetches again and recognises the same source (same object mtimes)
    assert main(["convert", f"{bucket}/sources/ds", str(out), *FLAGS]) == 0
    assert "already complete" in capsys.readouterr().out


def test_convert_s3_to_s3_verifies(src, reference, bucket):
    import s3fs

    s3fs.S3FileSystem().put(str(src), f"{bucket[5:]}/sources/ds", recursive=True)
    assert main(["convert", f"{bucket}/sources/ds", f"{bucket}/out", *FLAGS]) == 0
    assert main(["verify", f"{bucket}/out"]) == 0
    got, want = _remote_files(f"{bucket}/out"), _local_files(reference)
    assert all(got[n] == want[n] for n in want if n.startswith("shard-"))


def test_missing_s3_source_names_the_url(bucket, tmp_path, capsys):
    assert main(["convert", f"{bucket}/nothing", str(tmp_path / "out"), *FLAGS]) == 2
    assert f"{bucket}/nothing: no files there" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("src_arg", ["lerobot/pusht", "hf://datasets/lerobot/pusht"])
def test_hub_source_offline_names_the_repo(src_arg, tmp_path, capsys, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.chdir(tmp_path)  # no local folder lerobot/pusht
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    assert main(["convert", src_arg, str(tmp_path / "out"), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert "lerobot/pusht" in err and "offline" in err
    assert not (tmp_path / "out").exists()


def test_mangled_url_is_refused(src, tmp_path, capsys):
    assert main(["convert", str(src), "s3:/bucket/out", *FLAGS]) == 2
    assert "pass URLs as str" in capsys.readouterr().err


def test_convert_to_s3_with_two_workers_equals_local(src, reference, bucket):
    """Worker processes forked while the storage client and the upload thread exist."""
    url = f"{bucket}/out"
    assert main(["convert", str(src), url, "--workers", "2", "--shard-size", str(SHARD), "--no-progress"]) == 0
    assert _remote_files(url) == _local_files(reference)


@pytest.mark.timeout(60)
def test_streamer_uploads_shards_journaled_by_this_run(bucket, tmp_path):
    """Each shard goes up once its journal is written; an earlier run's journal and a shard of
    skipped episodes only are left to publish."""
    from datakit.convert.remote.publish import ShardStreamer

    out, url, record = tmp_path / "out", f"{bucket}/out", tmp_path / "uploaded.json"
    staging = out / ".datakit-staging"
    staging.mkdir(parents=True)

    def commit(i: int, placed: list) -> None:
        data = bytes([i]) * (1000 + i)
        (out / f"shard-{i:06d}.tar").write_bytes(data)
        (staging / f"shard-{i:06d}.journal").write_text(json.dumps(
            {"name": f"shard-{i:06d}.tar", "bytes": len(data), "sha256": f"{i:064x}", "placed": placed}))

    commit(0, [{"episode_index": 0}])  # an earlier run's
    os.utime(staging / "shard-000000.journal", (time.time() - 60, time.time() - 60))
    with ShardStreamer(out, url, record, interval=0.02) as streamer:
        commit(1, [{"episode_index": 1}])
        commit(2, [])  # every episode skipped: deleted before the index, never uploaded
        deadline = time.time() + 20
        while "shard-000001.tar" not in _remote_files(url) and time.time() < deadline:
            time.sleep(0.05)
        remote = _remote_files(url)
    assert streamer.error is None
    assert sorted(remote) == ["shard-000001.tar"] and remote["shard-000001.tar"] == bytes([1]) * 1001
    assert json.loads(record.read_text()) == {"url": url, "shards": {"shard-000001.tar": f"{1:064x}"}}


def test_missing_bucket_is_refused_before_converting(src, s3_server, cache, capsys):
    url = "s3://no-such-bucket-datakit/out"
    assert main(["convert", str(src), url, *FLAGS]) == 2
    assert f"{url}: bucket no-such-bucket-datakit does not exist" in capsys.readouterr().err
    assert not list(cache.glob("convert/out-*/out")), "nothing was converted"


def test_bad_remote_source_names_the_object(src, bucket, tmp_path, capsys):
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.put(str(src), f"{bucket[5:]}/sources/ds", recursive=True)
    video = next(p for p in fs.find(f"{bucket[5:]}/sources/ds/videos") if p.endswith(".mp4"))
    fs.rm_file(video)
    assert main(["convert", f"{bucket}/sources/ds", str(tmp_path / "out"), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert f"s3://{video.rsplit('/', 1)[0]}" in err and "convert/src-" not in err, err


def test_publish_again_uploads_only_the_index(reference, bucket, tmp_path):
    """After an interrupted publish the shards this machine uploaded (per its record) are skipped."""
    from datakit.convert.remote.publish import publish

    url, record = f"{bucket}/out", tmp_path / "uploaded.json"
    shards = sorted(p.name for p in reference.glob("shard-*.tar"))
    assert publish(reference, url, record) == [*shards, "frames.arrow", "index.json", "checksums.json"]
    assert publish(reference, url, record) == ["frames.arrow", "index.json", "checksums.json"]
    assert _remote_files(url) == _local_files(reference)


def test_fetch_source_keeps_complete_files(src, bucket, tmp_path):
    """A rerun after a kill fetches only what is missing or changed (same size and mtime: kept)."""
    import s3fs

    from datakit.convert.remote.source import fetch_source

    fs = s3fs.S3FileSystem()
    fs.put(str(src), f"{bucket[5:]}/sources/ds", recursive=True)
    folder = fetch_source(f"{bucket}/sources/ds", tmp_path / "scratch")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    assert [p.relative_to(folder) for p in files] == sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    assert all(p.read_bytes() == (src / p.relative_to(folder)).read_bytes() for p in files)
    inodes = {p: p.stat().st_ino for p in files}
    files[0].unlink()
    fetch_source(f"{bucket}/sources/ds", tmp_path / "scratch")
    assert files[0].exists() and all(p.stat().st_ino == inodes[p] for p in files[1:])


def test_finished_remote_out_with_bad_index_names_the_url(src, bucket, capsys):
    import s3fs

    url = f"{bucket}/out"
    s3fs.S3FileSystem().pipe_file(f"{url[5:]}/checksums.json", b"{}")
    s3fs.S3FileSystem().pipe_file(f"{url[5:]}/index.json", b"not json")
    assert main(["convert", str(src), url, *FLAGS]) == 2
    err = capsys.readouterr().err
    # checksums.json is checked first (an index that is not the conversion's means nothing): the
    # line names the remote file by URL, never the local scratch copy
    assert (f"{url}/index.json" in err or f"{url}/checksums.json" in err) and "datakit-index-" not in err, err

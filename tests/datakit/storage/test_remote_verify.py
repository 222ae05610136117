"""`verify` on an s3:// root, against a real S3-compatible server (moto, real HTTP, via s3fs):
a clean upload is OK with the same counts as the local folder; a damaged, truncated or missing
shard, or a missing checksums.json, is named by its URL; at most one shard is on local disk at
a time. The oracle for which object is damaged is the damage itself (planted with plain byte
edits and uploaded with plain s3fs `put`); the local verify of the same damaged copy must list
the same problems, with local paths where the remote one has URLs."""
import shutil
from pathlib import Path

import pytest

# the fixtures (s3_server, bucket, converted, uploaded) come from conftest.py

pytest.importorskip("s3fs")

from datakit.errors import StorageError  # noqa: E402
from datakit.shards.index import load_index  # noqa: E402
from datakit.verify import remote as vr  # noqa: E402
from datakit.storage.retry import RetryPolicy  # noqa: E402
from datakit.verify import verify  # noqa: E402

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, jitter=0.0)


def _put(local: Path, url: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem()
    for p in sorted(local.iterdir()):  # plain uploads, in no particular commit order
        fs.put_file(str(p), f"{url}/{p.name}"[len("s3://"):])


@pytest.fixture
def shard_downloads(monkeypatch, tmp_path):
    """Every shard download by verify_remote, with the .tar files already in its scratch folder."""
    seen, real = [], vr.download

    def recording(url, dest, **kw):
        if url.endswith(".tar"):
            seen.append((url.rsplit("/", 1)[1], sorted(p.name for p in Path(dest).parent.glob("*.tar"))))
        return real(url, dest, **kw)

    monkeypatch.setattr(vr, "download", recording)
    return seen


@pytest.mark.timeout(120)
def test_verify_clean_s3_root_is_ok_with_the_local_counts(converted, uploaded, shard_downloads, tmp_path):
    local = verify(converted)
    rep = verify(uploaded, scratch=tmp_path / "scratch")
    assert rep.ok and local.ok, rep.problems
    assert (rep.shards, rep.bytes, rep.frames, rep.offsets_checked) == (
        local.shards, local.bytes, local.frames, local.offsets_checked)
    names = [s.name for s in load_index(converted).shards]
    assert [n for n, _ in shard_downloads] == names
    assert all(already == [] for _, already in shard_downloads)  # one shard on disk at a time
    assert list((tmp_path / "scratch").iterdir()) == []  # the working folder is gone


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-512])


DAMAGES = {
    "flipped byte": (1, _flip_byte, "sha256 differs from the index (the shard is damaged)"),
    "truncated": (2, _truncate, "differs from the index"),
    "missing": (3, lambda p: p.unlink(), "missing shard file"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_verify_names_the_damaged_shard_on_s3(converted, bucket, tmp_path, damage, shard_downloads):
    shard, plant, message = DAMAGES[damage]
    copy = Path(shutil.copytree(converted, tmp_path / "copy"))
    name = load_index(copy).shards[shard].name
    plant(copy / name)
    url = f"{bucket}/damaged"
    _put(copy, url)
    rep = verify(url)
    assert not rep.ok
    assert str(rep.problems[0]).startswith(f"{url}/{name}: ") and message in str(rep.problems[0]), rep.problems
    assert len(rep.problems) == 1
    # the same checks as on the local copy, with URLs for local paths
    assert [str(p) for p in rep.problems] == [str(p).replace(f"{copy}/", f"{url}/") for p in verify(copy).problems]
    if damage != "flipped byte":  # a wrong size is seen from the listing: never downloaded
        assert name not in [n for n, _ in shard_downloads]


@pytest.mark.timeout(120)
def test_verify_s3_root_without_checksums_says_it_did_not_finish(converted, bucket, tmp_path):
    copy = Path(shutil.copytree(converted, tmp_path / "copy"))
    (copy / "checksums.json").unlink()
    url = f"{bucket}/unfinished"
    _put(copy, url)
    rep = verify(url)
    assert [str(p) for p in rep.problems] == [f"{url}/checksums.json: missing: the conversion did not finish (or the file was removed)"]


@pytest.mark.timeout(120)
def test_verify_s3_root_with_a_failing_server_raises_naming_the_url(converted, uploaded, tmp_path, s3_server):
    from flaky_proxy import FlakyProxy

    proxy = FlakyProxy(s3_server)
    try:
        opts = {"endpoint_url": proxy.url, "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
        proxy.fail_next(10**6, ".tar")
        with pytest.raises(StorageError, match=rf"^{uploaded}/shard-000000\.tar: "):
            vr.verify_remote(uploaded, storage_options=opts, policy=FAST)
        proxy.fail_next(2, ".tar")  # errors for a while only: retried, then the verdict is OK
        assert vr.verify_remote(uploaded, storage_options=opts, policy=FAST).ok
    finally:
        proxy.close()

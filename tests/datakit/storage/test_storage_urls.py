"""Where a path lives (local, fsspec URL, Hub repo id), the offline Hub error, the retry
classification, and file:// uploads. No server needed; the Hub tests run with HF_HUB_OFFLINE=1
(tests/conftest.py sets it), as on a machine without a network."""
import os

import pytest

from datakit.errors import StorageError
from datakit.storage import transfer
from datakit.storage.retry import RetryPolicy, is_transient, with_retries
from datakit.storage.urls import is_remote, is_repo_id, resolve


def test_resolve_and_is_remote(tmp_path, monkeypatch):
    assert resolve("lerobot/pusht") == "hf://datasets/lerobot/pusht"
    assert is_remote("lerobot/pusht") and is_remote("s3://b/x") and is_remote("gs://b/x")
    assert resolve("file:///data/out") == "/data/out" and not is_remote("file:///data/out")
    assert not is_remote("/data/out") and not is_remote("out") and not is_remote("a/b/c")
    # a local folder that happens to look like a repo id is the local folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lerobot" / "pusht").mkdir(parents=True)
    assert not is_repo_id("lerobot/pusht") and resolve("lerobot/pusht") == "lerobot/pusht"


@pytest.mark.timeout(60)
def test_offline_hub_error_names_the_repo_id(tmp_path):
    pytest.importorskip("huggingface_hub")
    from datakit.storage.urls import filesystem

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with pytest.raises(StorageError, match=r"^lerobot/pusht: .*offline \(HF_HUB_OFFLINE=1\)"):
        filesystem("lerobot/pusht")
    with pytest.raises(StorageError, match=r"^lerobot/pusht: .*meta/info.json.*offline"):
        transfer.fetch("hf://datasets/lerobot/pusht", ["meta/info.json"], tmp_path)


def test_retry_classification():
    assert is_transient(ConnectionError("reset")) and is_transient(TimeoutError())
    assert is_transient(OSError(5, "Input/output error"))
    assert not is_transient(FileNotFoundError("x")) and not is_transient(PermissionError("x"))
    assert not is_transient(StorageError("u", "offline"))

    class OfflineModeIsEnabled(ConnectionError):
        pass

    assert not is_transient(OfflineModeIsEnabled("offline"))


def test_with_retries_backoff_and_final_error():
    sleeps, calls = [], []
    policy = RetryPolicy(attempts=5, base_delay=0.1, max_delay=0.3, jitter=0.0, sleep=sleeps.append)

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("read timed out")
        return "ok"

    assert with_retries(flaky, "s3://b/k", "read", policy) == "ok" and sleeps == [0.1, 0.2]
    sleeps.clear()
    with pytest.raises(StorageError, match=r"^s3://b/k: read failed 5 times.*TimeoutError"):
        with_retries(lambda: (_ for _ in ()).throw(TimeoutError("t")), "s3://b/k", "read", policy)
    assert sleeps == [0.1, 0.2, 0.3, 0.3]  # doubling, capped at max_delay


def test_upload_to_a_local_target_is_atomic_and_checked(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(100_000))
    transfer.upload(src, f"file://{tmp_path}/out/a.bin")
    assert (tmp_path / "out" / "a.bin").read_bytes() == src.read_bytes()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a.bin"]


def test_fetch_from_a_local_root_reads_in_place(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text("{}")
    assert transfer.fetch(str(tmp_path), ["meta/info.json"], tmp_path / "scratch") == [tmp_path / "meta/info.json"]


def test_a_url_mangled_by_pathlib_is_refused():
    from pathlib import Path

    with pytest.raises(ValueError, match="pathlib"):
        resolve(Path("s3://bucket/ds"))


def test_shard_sequence_collapses_runs_only():
    from datakit.storage.download_ahead import shard_sequence

    assert shard_sequence([3, 3, 3, 1, 1, 3, 0, 0]) == [3, 1, 3, 0]
    assert shard_sequence([]) == []

"""Every remote call has a deadline and one retry loop (issue 14, item 3).

A server that stops answering (a socket that is listening but never accepts: what a SIGSTOPped
server looks like from outside) fails each attempt after `RetryPolicy.timeout` and the call
with a StorageError naming the URL; botocore's and s3fs's own retries are off, so each of
datakit's attempts is one request (counted at the test S3 server's proxy, tests/fixtures/flaky_proxy.py)
and a dead endpoint fails after the policy's delays only: 7.5 s with the defaults, as
docs/scale-out.md says. Delays are recorded, not slept, so the tests take seconds.
"""
from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")

from datakit.errors import StorageError  # noqa: E402
from datakit.storage import transfer  # noqa: E402
from datakit.storage.cache import ShardCache  # noqa: E402
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy  # noqa: E402
from datakit.verify.remote import verify_remote  # noqa: E402

DOCS = Path(__file__).resolve().parents[3] / "docs" / "scale-out.md"
pytestmark = pytest.mark.timeout(60)


def _policy(attempts: int = 2, timeout: float = 0.5) -> tuple[RetryPolicy, list[float]]:
    slept: list[float] = []
    return RetryPolicy(attempts=attempts, base_delay=0.01, max_delay=0.05, jitter=0.0, timeout=timeout,
                       sleep=slept.append), slept


@pytest.fixture
def stalled():
    """http://127.0.0.1:PORT that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.fixture
def dead():
    """An endpoint that closes every connection at once; counts them (one per request)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    count = [0]

    def serve():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            count[0] += 1
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{s.getsockname()[1]}", count
    s.close()


@pytest.fixture
def flaky(s3_server):
    from flaky_proxy import FlakyProxy

    proxy = FlakyProxy(s3_server)
    yield proxy
    proxy.close()


def test_stalled_server_fails_each_call_naming_the_url(uploaded, stalled, tmp_path):
    opts = {"endpoint_url": stalled}
    policy, slept = _policy(attempts=2, timeout=0.5)
    url = f"{uploaded}/index.json"
    calls = {
        "download": lambda: transfer.download(url, tmp_path / "x", storage_options=opts, policy=policy),
        "stat": lambda: transfer.remote_size(url, storage_options=opts, policy=policy),
        "upload": lambda: transfer.upload(Path(__file__), f"{uploaded}/up.txt", storage_options=opts, policy=policy),
    }
    for what, call in calls.items():
        t0 = time.monotonic()
        with pytest.raises(StorageError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"{uploaded}/") and "failed 2 times" in msg and "\n" not in msg, (what, msg)
        assert time.monotonic() - t0 < 20, what  # 2 attempts of 0.5 s (the pytest timeout guards the hang)
    assert not (tmp_path / "x").exists()


def test_verify_and_the_cache_fail_on_a_stalled_server(uploaded, stalled, tmp_path):
    """What hung for 1200 s+ (`datakit verify s3://...`) and what the loader opens."""
    opts = {"endpoint_url": stalled}
    policy, _ = _policy(attempts=2, timeout=0.5)
    with pytest.raises(StorageError, match=rf"^{uploaded}/checksums.json: download failed 2 times"):
        verify_remote(uploaded, storage_options=opts, policy=policy, scratch=tmp_path / "scratch")
    with pytest.raises(StorageError, match=rf"^{uploaded}/checksums.json: read failed 2 times"):
        ShardCache(uploaded, tmp_path / "cache", max_bytes=1 << 30, storage_options=opts, policy=policy)


def test_each_attempt_is_one_request(uploaded, flaky, tmp_path):
    """A server answering 503 SlowDown to everything: datakit's attempts, and nothing nested."""
    opts = {"endpoint_url": flaky.url}
    policy, slept = _policy(attempts=3)
    flaky.fail_next(10**6, "index.json")
    with pytest.raises(StorageError, match=rf"^{uploaded}/index.json: download failed 3 times"):
        transfer.download(f"{uploaded}/index.json", tmp_path / "x", storage_options=opts, policy=policy)
    assert flaky.failed == 3
    assert slept == [0.01, 0.02]


def test_dead_endpoint_with_the_default_policy_takes_what_the_docs_say(uploaded, dead, tmp_path):
    """The default policy against an endpoint that drops every connection: 5 times the requests
    of one attempt, and delays between them (recorded) that add up to the documented
    0.5 + 1 + 2 + 4 = 7.5 s +-25%."""
    endpoint, connections = dead
    m = re.search(r"backoff \(([^)]*); (\d+) attempts\)", DOCS.read_text())
    documented = [float(x) for x in re.findall(r"([\d.]+) s", m.group(1))]
    assert int(m.group(2)) == DEFAULT_RETRY.attempts and len(documented) == DEFAULT_RETRY.attempts - 1
    url, opts = f"{uploaded}/index.json", {"endpoint_url": endpoint}
    with pytest.raises(StorageError, match="stat failed 1 times"):
        transfer.remote_size(url, storage_options=opts, policy=dataclasses.replace(DEFAULT_RETRY, attempts=1))
    per_attempt, connections[0] = connections[0], 0
    slept: list[float] = []
    with pytest.raises(StorageError, match=rf"^{url}: stat failed 5 times"):
        transfer.remote_size(url, storage_options=opts, policy=dataclasses.replace(DEFAULT_RETRY, sleep=slept.append))
    assert 1 <= per_attempt <= 2  # s3fs's info: a HEAD, then a listing
    assert connections[0] == DEFAULT_RETRY.attempts * per_attempt
    assert len(slept) == len(documented)
    for got, want in zip(slept, documented):
        assert want * (1 - DEFAULT_RETRY.jitter) <= got <= want * (1 + DEFAULT_RETRY.jitter)
    assert sum(documented) == 7.5

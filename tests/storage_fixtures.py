"""Fixtures for the object-storage tests: a real S3-compatible server (moto in server mode, its
own process, real HTTP on 127.0.0.1) reached through s3fs, and a tiny converted dataset.

tests/conftest.py imports them once for the whole session (do not import them into test modules:
each importing module would get its own session fixture, i.e. a second server). Everything skips
cleanly when moto or s3fs is not installed (`pip install '.[remote,dev]'`).
"""
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

LENGTHS = (20, 23, 17, 12)
CAMS = ("observation.images.top", "observation.images.wrist")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """Endpoint URL of a moto S3 server; AWS_* variables point s3fs (and subprocesses) at it."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    pytest.importorskip("flask")  # moto[server]
    port = _free_port()
    log = open(os.devnull, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=log)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.skip("moto server did not start")
            time.sleep(0.05)
    endpoint = f"http://127.0.0.1:{port}"
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # no cached filesystem may point at another endpoint
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def bucket(s3_server) -> str:
    """A fresh, empty bucket per test: `s3://<name>`."""
    import s3fs

    name = f"t-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return f"s3://{name}"


@pytest.fixture
def uploaded(converted, bucket) -> str:
    """`converted`, uploaded in commit order to `<bucket>/ds`."""
    from datakit.storage import transfer
    from datakit.storage.retry import RetryPolicy

    url = f"{bucket}/ds"
    transfer.upload_output(converted, url, policy=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05))
    return url


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> Path:
    """A finished conversion with several shards (real AV1 video through datakit.convert)."""
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("storage_src")
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=LENGTHS, height=32, width=64,
                               cameras=CAMS, blank_cameras=())
    out = root / "out"
    convert(src, out, ConvertConfig(workers=1, progress=False, shard_size=200_000))
    return out

"""Missing or refused S3 credentials are one line naming the URL and what to set, exit 2, in
`datakit convert`, `verify` and `plan` (issue 14, item 12), not a PermissionError or
NoCredentialsError traceback.

Refused: the test S3 server behind tests/fixtures/flaky_proxy.py answering 403 InvalidAccessKeyId /
AccessDenied to every request. Missing: no AWS_* keys, no credential files, no instance metadata.
"""
from __future__ import annotations

import pytest

pytest.importorskip("s3fs")

from datakit.cli import main  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fresh_s3fs():
    """s3fs caches filesystems (and their resolved credentials) per options: none may leak in or out."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def flaky(s3_server):
    from flaky_proxy import FlakyProxy

    proxy = FlakyProxy(s3_server)
    yield proxy
    proxy.close()


def _commands(converted, uploaded, bucket):
    src = converted.parent / "src"  # storage_fixtures' source of `converted`
    return {
        "convert": ["convert", str(src), f"{bucket}/new", "--no-progress"],
        "verify": ["verify", uploaded],
        "plan": ["plan", uploaded, "--samples-per-s", "100"],
    }


def _one_line_naming(capsys, argv, url_prefix: str, *words: str) -> None:
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert url_prefix in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("code", ["InvalidAccessKeyId", "AccessDenied"])
def test_refused_credentials_are_one_line(converted, uploaded, bucket, flaky, fresh_s3fs, monkeypatch, capsys, code):
    monkeypatch.setenv("AWS_ENDPOINT_URL", flaky.url)
    flaky.fail_next(10**6, "", status=403, code=code)
    for name, argv in _commands(converted, uploaded, bucket).items():
        _one_line_naming(capsys, argv, bucket, "access refused", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    assert flaky.failed >= 3


def test_missing_credentials_are_one_line(converted, uploaded, bucket, fresh_s3fs, monkeypatch, tmp_path, capsys):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, argv in _commands(converted, uploaded, bucket).items():
        _one_line_naming(capsys, argv, bucket, "no credentials", "AWS_ACCESS_KEY_ID")

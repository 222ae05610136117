"""A store that refuses us, as one line: the URL, what the store said, and what to set.

botocore raises NoCredentialsError (no key anywhere) and s3fs turns 403 answers (AccessDenied,
InvalidAccessKeyId, SignatureDoesNotMatch, ExpiredToken) into PermissionError; neither names
the URL. `retry.with_retries` passes every failure through `refusal` first, so convert, verify,
plan and the loaders all print the same line (exit 2) instead of a traceback.
"""
from __future__ import annotations

from datakit.errors import StorageError

_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                   "NoAuthTokenError", "DefaultCredentialsError")
# what to set, per URL scheme (the usual places each fsspec backend reads)
_WHAT_TO_SET = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for an "
          "S3-compatible server, or pass storage_options key/secret (anon=True for a public bucket)",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS (or run `gcloud auth application-default login`), or pass "
          "storage_options token",
    "hf": "log in (`huggingface-cli login`) or set HF_TOKEN",
}
_ALIASES = {"s3a": "s3", "gcs": "gs"}


def what_to_set(url: str) -> str:
    s = url.split("://", 1)[0].lower() if "://" in url else ""
    return _WHAT_TO_SET.get(_ALIASES.get(s, s), "check the credentials this filesystem reads (see its storage_options)")


def refusal(exc: BaseException, url: str) -> StorageError | None:
    """StorageError naming `url` when `exc` says the credentials are missing or refused, else None."""
    said = (str(exc).strip().splitlines() or [""])[0][:200]
    if type(exc).__name__ in _NO_CREDENTIALS:
        return StorageError(url, f"no credentials found ({said}); {what_to_set(url)}")
    if isinstance(exc, PermissionError):
        return StorageError(url, f"access refused ({said or type(exc).__name__}): wrong credentials, or they lack "
                                 f"permission; {what_to_set(url)}")
    return None

"""Where a path lives: a local folder, an fsspec URL (s3://, gs://, file://, hf://...) or a
Hugging Face Hub repo id.

LeRobot users name datasets by Hub repo id; `lerobot/pusht` (when no such local folder exists)
means `hf://datasets/lerobot/pusht` and goes through huggingface_hub's fsspec filesystem, the
same code path as `s3://`. Credentials and endpoints come from the usual places of each
filesystem (AWS_* variables, `AWS_ENDPOINT_URL` for an S3-compatible server, fsspec's
`FSSPEC_<PROTOCOL>_<OPTION>` variables) or from `storage_options`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from datakit.errors import StorageError
from datakit.storage.retry import DEFAULT_RETRY, RetryPolicy

HF_DATASETS = "hf://datasets/"
# owner/name as the Hub spells it (letters, digits, '-', '_', '.'), nothing more
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_MANGLED = re.compile(r"^(s3|gs|gcs|hf|az|abfs|file|https?):/[^/]")  # pathlib.Path("s3://b") == "s3:/b"


def scheme(path: str | Path) -> str | None:
    """The URL scheme ("s3", "hf", "file", ...) or None for a plain path."""
    m = _SCHEME.match(str(path))
    return m.group(1).lower() if m else None


def is_repo_id(path: str | Path) -> bool:
    """`owner/name` that is not an existing local path: a Hub dataset repo id."""
    text = str(path)
    return bool(_REPO_ID.match(text)) and not Path(text).exists()


def resolve(path: str | Path) -> str:
    """The canonical form of a location: a Hub repo id becomes `hf://datasets/<id>`, `file://x`
    becomes the plain path x, other URLs and local paths are returned as they are."""
    text = str(path)
    if _MANGLED.match(text):
        raise ValueError(f"{text}: a URL with one slash after the scheme (was it passed through pathlib.Path?); "
                         "pass URLs as str")
    if scheme(text) == "file":
        return text[len("file://"):]
    if scheme(text) is None and is_repo_id(text):
        return HF_DATASETS + text
    return text


def local_path(path: str | Path) -> str | Path:
    """`file://x` as the plain path x (what every command reads it as: the folder x); anything
    else as given."""
    return str(path)[len("file://"):] if scheme(path) == "file" else path


def is_remote(path: str | Path) -> bool:
    """True when `path` must be reached through fsspec (any scheme but file://, or a repo id)."""
    return scheme(resolve(path)) is not None


def repo_id_of(url: str) -> str | None:
    """The Hub repo id of an `hf://datasets/owner/name[/...]` URL (None for other URLs)."""
    if not url.startswith(HF_DATASETS):
        return None
    parts = url[len(HF_DATASETS):].split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else None


def check_hub_reachable(url: str) -> None:
    """Raise StorageError naming the repo id when `url` is on the Hub and the Hub is switched off
    (HF_HUB_OFFLINE=1). Files already in huggingface_hub's local cache are still read
    (`transfer.fetch` goes through `hf_hub_download`, which serves them offline)."""
    repo = repo_id_of(url)
    if repo is None:
        return
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise StorageError(repo, "Hugging Face Hub dataset, but this machine is offline (HF_HUB_OFFLINE=1); "
                                 "download it where there is a network and pass the local folder")


def filesystem(url: str | Path, storage_options: dict[str, Any] | None = None, policy: RetryPolicy | None = None):
    """(fsspec filesystem, path inside it) for a URL, repo id or local path.

    On s3:// the attempt timeout of `policy` (default: retry.DEFAULT_RETRY) is set and the
    retries of botocore and s3fs are turned off (`s3_options`): `retry.with_retries` is the one
    retry loop. A missing fsspec backend (s3fs, gcsfs, huggingface_hub) is named in the error."""
    import fsspec

    target = resolve(url)
    check_hub_reachable(target)
    s3 = scheme(target) in S3_SCHEMES
    options = s3_options(storage_options, policy or DEFAULT_RETRY) if s3 else (storage_options or {})
    try:
        fs, path = fsspec.core.url_to_fs(target, **options)
    except ImportError as e:
        raise StorageError(target, f"no fsspec filesystem for {scheme(target)}:// ({e}); "
                                   "install the remote extra: pip install 'robodata[remote]'") from None
    except ValueError as e:
        raise StorageError(target, f"not a usable storage URL: {e}") from None
    if s3:
        fs.retries = 1  # s3fs's own loop around each call (an attribute, not an option); cached per options
    return fs, path


S3_SCHEMES = ("s3", "s3a")


def deadline(fs, policy: RetryPolicy, nbytes: int = 0) -> dict[str, float]:
    """Keyword arguments giving one call of `fs` the policy's whole deadline: `timeout=` is
    taken by fsspec's sync wrapper of an async filesystem, which cancels the call after it;
    other filesystems get nothing (local ones need none)."""
    from fsspec.asyn import AsyncFileSystem

    return {"timeout": policy.deadline(nbytes)} if isinstance(fs, AsyncFileSystem) else {}


def s3_options(storage_options: dict[str, Any] | None, policy: RetryPolicy) -> dict[str, Any]:
    """`storage_options` for s3fs with botocore's connect/read timeouts at `policy.timeout` and
    botocore's retries off (one attempt per call), unless the caller set them itself."""
    options = dict(storage_options or {})
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", policy.timeout)
    config.setdefault("read_timeout", policy.timeout)
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    options["config_kwargs"] = config
    return options


def join(url: str, *names: str) -> str:
    """`url/name/...` for URLs and local paths alike (no normalisation of the scheme part)."""
    out = str(url).rstrip("/")
    for n in names:
        out += "/" + n.strip("/")
    return out

"""`datakit convert SRC OUT` where SRC or OUT is on object storage (an fsspec URL, or for SRC a
Hugging Face Hub repo id): a local conversion between two local scratch folders.

- Remote SRC: every file is fetched into `<cache>/src-<hash of the URL>/<name>/`
  (`source.fetch_source`), converted from there, and the scratch copy is deleted once
  the conversion is complete (Hub files stay in huggingface_hub's own cache).
- Remote OUT: the conversion runs into `<cache>/out-<hash of the URL>/out/`, a stable path, so
  a rerun of the same command resumes it like any local OUT (journaled shards kept). Each shard
  is uploaded as soon as it is committed (`publish.ShardStreamer`); at the end the rest is
  published in commit order (`publish.publish`: shards, frames.arrow, index.json,
  checksums.json last) and the local copy is deleted. A remote OUT that holds checksums.json is
  finished: its index files are downloaded and checked as a local OUT's are (against
  checksums.json, this source's fingerprint, these options, and each shard's size from one
  listing); it is already complete, or refused naming the damage. A remote OUT holding files a
  conversion does not write is refused; `--force` deletes our own remote files (checksums.json
  first) and starts over.

`<cache>` is `$DATAKIT_CACHE/convert`, else `$XDG_CACHE_HOME/datakit/convert`, else
`~/.cache/datakit/convert`. One conversion per remote OUT at a time on a machine (a lock on the
local staging folder); two machines writing the same URL are not detected.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from datakit.convert.config import ConvertConfig
from datakit.convert.outdir import is_ours, open_output, output_lock, remove_ours
from datakit.convert.remote.publish import (
    ShardStreamer, publish, remote_names, remote_sizes, remove_remote,
)
from datakit.convert.remote.source import fetch_source
from datakit.convert.run import ConvertSummary, convert_local
from datakit.errors import IndexFileError, OutputError, SourceError
from datakit.shards.index import load_index
from datakit.shards.names import CHECKSUMS_NAME, FRAMES_NAME, INDEX_FILES, MANIFEST_NAME
from datakit.storage.retry import DEFAULT_RETRY, with_retries
from datakit.storage.roots import CACHE_ENV, remote_url
from datakit.storage.transfer import download
from datakit.storage.urls import filesystem, is_remote, join, resolve, scheme


def remote_out(out: str | Path) -> str | None:
    """The URL of a remote OUT, None for a local folder. Only a URL with a scheme is remote
    (`file://x` is the folder x; an `owner/name` OUT is a relative folder, never the Hub)."""
    url = remote_url(out)
    if url is None:
        return None
    if scheme(url) == "hf":
        raise OutputError(url, "writing a conversion to the Hugging Face Hub is not supported; convert to a "
                          "folder or a bucket, then upload it with huggingface_hub")
    return url.rstrip("/")


def is_remote_job(src: str | Path, out: str | Path) -> bool:
    """SRC or OUT is remote (or a file:// URL): the conversion goes through `convert_remote`."""
    return is_remote(src) or remote_out(out) is not None or "file" in (scheme(str(src)), scheme(str(out)))


def convert_cache_dir() -> Path:
    """Where remote conversions stage their files (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "convert"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "datakit" / "convert"


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def _named(e: OutputError, local: str | Path, url: str) -> OutputError:
    """The same error naming the URL that the local staging path stands for."""
    return OutputError(e.where.replace(str(local), url), e.problem.replace(str(local), url))


def _source_named(e: SourceError, local: Path, url: str) -> SourceError:
    """A source error about the fetched copy, naming the remote file instead."""
    return SourceError(e.path.replace(str(local), url), e.problem.replace(str(local), url))


@contextmanager
def _locked(staging: Path, url: str, command: str | None) -> Iterator[None]:
    """One conversion to `url` at a time on this machine; the refusal names the URL."""
    staging.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        try:
            stack.enter_context(output_lock(staging, command))
        except OutputError as e:
            raise _named(e, staging, url) from None
        yield


BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")  # the first path part is a bucket


def _claim_remote(url: str) -> list[str]:
    """The names under the remote OUT; refuse one holding files a conversion does not write, or
    in a bucket that does not exist (before anything is converted, not at the first upload)."""
    names = remote_names(url)
    if not names and scheme(url) in BUCKET_SCHEMES:
        fs, path = filesystem(url)
        bucket = path.strip("/").split("/", 1)[0]
        if not with_retries(lambda: fs.exists(bucket), url, "bucket check", DEFAULT_RETRY):
            raise OutputError(url, f"bucket {bucket} does not exist (or these credentials cannot see it); "
                              "create it first")
    others = [n for n in names if not is_ours(n)]
    if others:
        raise OutputError(url, f"holds other files ({', '.join(others[:3])}); use an empty or new prefix")
    return names


def _finished(url: str, local_src: Path, cfg: ConvertConfig):
    """The index of the finished remote OUT, after the same checks as a finished local OUT
    (index files against checksums.json, same options, same source fingerprint, each shard's
    size); OutputError naming the URL otherwise."""
    from datakit.convert.fingerprint import source_fingerprint
    from datakit.sources import scan

    spec = scan(local_src, cfg.format)
    fingerprint = source_fingerprint(spec)
    with tempfile.TemporaryDirectory(prefix="datakit-index-") as tmp:
        for name in INDEX_FILES:
            try:
                download(join(url, name), Path(tmp) / name)
            except FileNotFoundError:
                pass  # named by load_index below
        sizes = remote_sizes(url)  # the shards' sizes, from one listing (not one HEAD per shard)
        try:
            open_output(Path(tmp), cfg.output_options(), fingerprint, spec, shard_size=sizes.get)
            return load_index(Path(tmp))
        except OutputError as e:
            raise _named(e, tmp, url) from None
        except IndexFileError as e:
            raise IndexFileError(e.path.replace(tmp, url), e.problem.replace(tmp, url)) from None


def convert_remote(src: str | Path, out: str | Path, cfg: ConvertConfig, *, force: bool = False,
                   command: str | None = None) -> ConvertSummary:
    """`convert` for a remote SRC and/or OUT (see the module docstring)."""
    t0 = time.perf_counter()
    src_url = resolve(str(src)).rstrip("/") if is_remote(src) else None
    out_url = remote_out(out)
    cache = convert_cache_dir()
    present = _claim_remote(out_url) if out_url else []  # a foreign prefix, a missing bucket: before any download
    src_scratch = cache / f"src-{_key(src_url)}" if src_url else None
    local_src = fetch_source(src_url, src_scratch) if src_url else Path(resolve(str(src)))
    staging = cache / f"out-{_key(out_url)}" if out_url else None
    try:
        summary = _convert_staged(local_src, out, out_url, staging, present, cfg, force, command)
    except SourceError as e:
        raise (_source_named(e, local_src, src_url) if src_url else e) from None
    _cleanup(src_scratch)
    if staging is not None:
        with contextlib.suppress(OSError):  # empty once published (the lock file goes with the lock)
            staging.rmdir()
    summary.seconds = time.perf_counter() - t0
    return summary


def _convert_staged(local_src: Path, out: str | Path, out_url: str | None, staging: Path | None, present: list[str],
                    cfg: ConvertConfig, force: bool, command: str | None) -> ConvertSummary:
    """Convert the local (or fetched) source into OUT; a remote OUT through the local `staging`
    folder, `present` being the names its prefix held at the start."""
    if out_url is None or staging is None:
        return convert_local(local_src, Path(resolve(str(out))), cfg, force=force, command=command)
    with _locked(staging, out_url, command):
        local_out, record = staging / "out", staging / "uploaded.json"
        if force:
            remove_remote(out_url, [n for n in (CHECKSUMS_NAME, MANIFEST_NAME, FRAMES_NAME) if n in present] +
                          [n for n in present if n.startswith("shard-") and is_ours(n)])
            record.unlink(missing_ok=True)
            if local_out.exists():
                remove_ours(local_out)
        elif CHECKSUMS_NAME in present:
            return ConvertSummary(_finished(out_url, local_src, cfg), 0.0, already_complete=True)
        try:
            with ShardStreamer(local_out, out_url, record):  # each committed shard goes up at once
                summary = convert_local(local_src, local_out, cfg, command=command)
        except OutputError as e:
            raise _named(e, local_out, out_url) from None
        publish(local_out, out_url, record)
        shutil.rmtree(local_out)
        record.unlink(missing_ok=True)
    summary.already_complete = False  # the local copy may have been complete; the remote was not
    return summary


def _cleanup(scratch: Path | None) -> None:
    """Delete a remote source's scratch copy (only files we fetched, or links into the Hub cache)."""
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)

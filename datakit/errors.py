"""Errors that name the file and the problem, so a bad input yields one readable line."""
from __future__ import annotations

import errno
from pathlib import Path


class DatakitError(Exception):
    """Base error: `str(err)` is a one-line message meant for the user."""


class SourceError(DatakitError):
    """A source file (table, video, metadata) is missing, unreadable or inconsistent."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # pickle by the two fields (DataLoader workers send errors to the parent)
        return (type(self), (self.path, self.problem))


class OutputError(DatakitError):
    """The output folder cannot be used (holds something else, another conversion, another
    source) or cannot be written (disk full, read-only, file too large). Never a bad input:
    `--on-error skip` does not skip it."""


def output_error(path: str | Path, e: OSError) -> OutputError:
    """One line naming the file in OUT and the errno, for an OSError raised while writing it."""
    code = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "no errno"
    return OutputError(f"{path}: cannot write output ({code}: {e.strerror or e})")


class ShardError(DatakitError):
    """A shard is missing or damaged (hash, size or offset mismatch)."""

    def __init__(self, shard: str | Path, problem: str):
        self.shard = str(shard)
        self.problem = problem
        super().__init__(f"{self.shard}: {problem}")

    def __reduce__(self):  # pickle by the two fields (DataLoader workers send errors to the parent)
        return (type(self), (self.shard, self.problem))


class IndexFileError(DatakitError):
    """`index.json`, `frames.arrow` or `checksums.json` of an output folder is malformed,
    inconsistent or not strict JSON; the message names the file and the field."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # pickle by the two fields (DataLoader workers send errors to the parent)
        return (type(self), (self.path, self.problem))


class ResourceLimitError(DatakitError):
    """The machine lacks a resource a run needs (shared memory, file descriptors); the
    message says how much is needed and what to raise."""


class StorageError(DatakitError):
    """Object storage (s3://, gs://, hf://, ...) cannot be read or written: offline, refused, or
    still failing after the retries. Names the URL (or Hub repo id) and the problem."""

    def __init__(self, url: str, problem: str):
        self.url = str(url)
        self.problem = problem
        super().__init__(f"{self.url}: {problem}")

    def __reduce__(self):
        return (type(self), (self.url, self.problem))

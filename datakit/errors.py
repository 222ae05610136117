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

    def __reduce__(self):  # crosses process boundaries (pool workers) with both fields
        return type(self), (self.path, self.problem)


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

    def __reduce__(self):
        return type(self), (self.shard, self.problem)

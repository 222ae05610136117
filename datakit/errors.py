"""Errors that name the file and the problem, so a bad input yields one readable line."""
from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path


class DatakitError(Exception):
    """Base error: `str(err)` is a one-line message meant for the user."""


class PlaceError(DatakitError):
    """An error about one place (a file, a shard, a URL): `<where>: <problem>`, both kept as fields."""

    def __init__(self, where: str | Path, problem: str):
        self.where = str(where)
        self.problem = problem
        super().__init__(f"{self.where}: {problem}")

    def __reduce__(self):  # pickle by the two fields (worker processes send errors to the parent)
        return (type(self), (self.where, self.problem))


@dataclass(frozen=True)
class Problem:
    """One thing wrong at one place, listed rather than raised (`datakit verify` names them all):
    `where` is the file, shard or URL, `what` the problem. Printed as `<where>: <what>`."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"

    @classmethod
    def of(cls, e: PlaceError) -> "Problem":
        return cls(e.where, e.problem)


class SourceError(PlaceError):
    """A source file (table, video, metadata) is missing, unreadable or inconsistent."""

    @property
    def path(self) -> str:
        return self.where


class ConfigError(PlaceError):
    """A convert option has a bad value, or a config file an unknown key: `where` names the
    option (`layout`, `resize`, ...) or the TOML file."""

    @property
    def option(self) -> str:
        return self.where


class OutputError(PlaceError):
    """The output folder cannot be used (holds something else, another conversion, another
    source) or cannot be written (disk full, read-only, file too large): `where` names the file
    or folder in OUT (or its URL). Never a bad input: `--on-error skip` does not skip it."""


def output_error(path: str | Path, e: OSError) -> OutputError:
    """One line naming the file in OUT and the errno, for an OSError raised while writing it."""
    code = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "no errno"
    return OutputError(path, f"cannot write output ({code}: {e.strerror or e})")


class ShardError(PlaceError):
    """A shard is missing or damaged (hash, size or offset mismatch)."""

    @property
    def shard(self) -> str:
        return self.where


class IndexFileError(PlaceError):
    """`index.json`, `frames.arrow` or `checksums.json` of an output folder is malformed,
    inconsistent or not strict JSON; the message names the file and the field."""

    @property
    def path(self) -> str:
        return self.where


class ResourceLimitError(DatakitError):
    """The machine lacks a resource a run needs (shared memory, file descriptors); the
    message says how much is needed and what to raise."""


class StorageError(PlaceError):
    """Object storage (s3://, gs://, hf://, ...) cannot be read or written: offline, refused, or
    still failing after the retries. Names the URL (or Hub repo id) and the problem."""

    @property
    def url(self) -> str:
        return self.where

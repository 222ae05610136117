"""DCP's FileSystemWriter, remembering the OSErrors its files raised, so that a failed save names
its errno (ENOSPC: No space left on device) and not torch's "unexpected pos 704 vs 598".

Why: torch.save's zip writer reports a write that failed inside it as a RuntimeError, the OSError
only as its `__context__`; with a process group DCP gathers each rank's failure by pickling it,
and a pickled exception keeps no context, so the errno is gone from what `dcp.save` raises (one
process without a group keeps it). The streams are watched on the rank that writes them instead:
each OSError of a write, flush or close is kept in `errors` and re-raised unchanged.

    writer = ErrnoWriter(path)
    dcp.save(state, storage_writer=writer)     # on failure: writer.errors holds the OSErrors seen
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem


class _Watched:
    """A stream whose write and flush record their OSErrors; everything else is the stream's."""

    def __init__(self, stream: Any, errors: list[OSError]):
        self._stream, self._errors = stream, errors

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except OSError as e:
            self._errors.append(e)
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._errors.append(e)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _WatchedFileSystem(FileSystem):
    def __init__(self, errors: list[OSError]):
        super().__init__()
        self.errors = errors

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        try:
            with super().create_stream(path, mode) as stream:
                yield _Watched(stream, self.errors) if "w" in mode else stream
        except OSError as e:  # the open, or the flush and close at the end
            self.errors.append(e)
            raise


class ErrnoWriter(FileSystemWriter):
    """FileSystemWriter(path) whose streams record their OSErrors in `self.errors` (module docstring)."""

    def __init__(self, path: str, **kw: Any):
        super().__init__(path, **kw)
        self.errors: list[OSError] = []
        self.fs = _WatchedFileSystem(self.errors)

"""A test hook of the Ray engine, kept out of the engine itself: kill a task's worker once, at a
named point, so tests can check that Ray's retry gives the same bytes
(tests/datakit/convert/ray_convert_cases.py, run in a process of its own).

`DATAKIT_TEST_KILL_TASK_ONCE="KIND:MARKER"`, KIND one of shard | episode | join: the first task
of that kind to create the marker file SIGKILLs its own worker (a shard task after its first
episode, an episode task after writing its part, a join task before its commit). Unset, the
engine passes no marker and nothing here runs.
"""
from __future__ import annotations

import os
import signal

KILL_ONCE_ENV = "DATAKIT_TEST_KILL_TASK_ONCE"


def kill_markers() -> dict[str, str]:
    """{kind: marker file} from the environment of the driver; empty when the hook is unset."""
    kind, _, marker = os.environ.get(KILL_ONCE_ENV, "").partition(":")
    return {kind: marker} if marker else {}


def kill_once(marker: str | None) -> None:
    """SIGKILL this process if `marker` is given and this call is the first to create it."""
    if not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)

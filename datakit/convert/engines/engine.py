"""What every engine shares: the unit of work (`Job`), and how a pool's worker processes are
tied to the parent and stopped by it. Both local engines (local.py: one task per shard,
local_split.py: one task per episode) and the Ray engine import it; none imports another.
"""
from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from datakit.sources.episode import EpisodeRef

Job = tuple[int, list[EpisodeRef]]  # (shard index, planned episodes)
STOP_WAIT_S = 10.0  # how long a SIGTERMed worker may take to exit before SIGKILL


def die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this worker when the parent dies (kill -9 included), so no orphan goes on
    writing into OUT beside a rerun."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def stop_workers(pool: ProcessPoolExecutor, workers: set[int]) -> None:
    """Stop now: cancel the queued tasks and end every worker (SIGTERM, then SIGKILL after
    STOP_WAIT_S), returning only once none runs, so no worker writes into OUT after this.
    (The executor's own shutdown cannot be waited on after a shutdown(wait=False), and a task
    already handed to a worker cannot be cancelled: hence the signals.)"""
    pool.shutdown(wait=False, cancel_futures=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in workers:
            if _running(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_WAIT_S
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.02)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (the executor reaps its workers in its own time)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")

"""What this process may use of the machine: the cores it is allowed to run on (cgroup/affinity)
and how it starts worker processes."""
from __future__ import annotations

import multiprocessing as mp
import os


def available_cpus() -> int:
    """Cores this process may run on: `sched_getaffinity` honours taskset, cpusets and container
    limits that `os.cpu_count()` ignores (a 2-core container on a 128-core host says 2 here)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def start_method() -> str:
    """How worker pools start their processes. fork starts workers in milliseconds (spawn re-imports
    torch and FFmpeg: ~2.5 s here); it is safe where pools are made: the parent has run no torch op
    (no OpenMP pool) and no decoder, and pyarrow resets its thread pool in a forked child.
    DATAKIT_MP_START overrides."""
    return os.environ.get("DATAKIT_MP_START", "fork" if "fork" in mp.get_all_start_methods() else "spawn")

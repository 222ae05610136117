"""What this process may use of the machine: the cores it is allowed to run on (cgroup/affinity)."""
from __future__ import annotations

import os


def available_cpus() -> int:
    """Cores this process may run on: `sched_getaffinity` honours taskset, cpusets and container
    limits that `os.cpu_count()` ignores (a 2-core container on a 128-core host says 2 here)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)

"""What this process may use of the machine: the cores it is allowed to run on (cgroup/affinity)
and how it starts worker processes."""
from __future__ import annotations

import multiprocessing as mp
import os
import sys


def available_cpus() -> int:
    """Cores this process may run on: `sched_getaffinity` honours taskset, cpusets and container
    limits that `os.cpu_count()` ignores (a 2-core container on a 128-core host says 2 here)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


_INHERITED_SCALERS: list = []  # PyAV reformatters a forked child inherited: kept alive, never freed


def forget_parent_scaler() -> None:
    """In a forked child: set aside PyAV's per-thread frame reformatter inherited from the parent.
    PyAV >= 18 keeps one per thread, and its swscale context owns slice threads that live only in
    the parent; the child's next `to_ndarray` would free them and wait forever in
    pthread_cond_destroy (seen: `datakit doctor --workers 2` hung after a decode in the same
    process). The child makes its own; the inherited one is kept, since freeing it is the hang."""
    frame = sys.modules.get("av.video.frame")
    local = getattr(frame, "_thread_local", None)
    inherited = getattr(local, "reformatter", None)
    if inherited is not None:
        _INHERITED_SCALERS.append(inherited)
        local.reformatter = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_parent_scaler)


def start_method() -> str:
    """How worker pools start their processes. fork starts workers in milliseconds (spawn re-imports
    torch and FFmpeg: ~2.5 s here); it is safe where pools are made: the parent has run no torch op
    (no OpenMP pool), pyarrow resets its thread pool in a forked child, and a forked child sets aside
    the PyAV scaler a decode in the parent left (`forget_parent_scaler`). DATAKIT_MP_START overrides."""
    return os.environ.get("DATAKIT_MP_START", "fork" if "fork" in mp.get_all_start_methods() else "spawn")

"""The record header every GPU bench script writes into its JSON: what ran, from which tree, when,
on which machine and card, so that a result in bench/results/ can be traced and run again.

    sys.path.insert(0, str(ROOT)); from bench.record import header
    doc = {**header(), ...}     # command, commit, dirty, date, machine, card

`card` is the GPUs as nvidia-smi names them (name, memory), read without opening a CUDA context in
the calling process, or "cpu" on a machine without one (a dry run). `commit` is None outside a git
checkout (a copied tree); `dirty` says whether tracked files differ from it.
"""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def commit() -> tuple[str | None, bool | None]:
    """HEAD and whether the tree differs from it; (None, None) outside a git checkout (a copied tree)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip())


def card() -> list[str] | str:
    """The GPUs ("NVIDIA H200, 143771 MiB" each), "cpu" where nvidia-smi finds none."""
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return [x.strip() for x in smi.splitlines() if x.strip()] or "cpu"


def machine() -> dict[str, Any]:
    """The host: name, cores, load, Python, and torch with its CUDA where installed."""
    try:
        import torch
        versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    except ImportError:
        versions = {}
    return {"host": platform.node(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()[0],
            "python": platform.python_version(), **versions}


def header(argv: list[str] | None = None) -> dict[str, Any]:
    """command (as typed: python3 + argv), commit, dirty, date (UTC), machine, card."""
    head, dirty = commit()
    return {"command": shlex.join(["python3", *(sys.argv if argv is None else argv)]), "commit": head, "dirty": dirty,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "card": card()}

"""trainkit's manifest of one checkpoint folder, `trainkit.json`, written last before the rename.

    {"format": "trainkit-checkpoint", "version": 1, "step": 100, "world_size": 8, "global_batch": 256,
     "dataset": {"sha256": {"index.json": "...", "frames.arrow": "..."}},   # the dataset's checksums.json
     "config": {...},                     # RunConfig.to_dict() of the run that wrote it
     "sched": {...},                      # the LR scheduler's state_dict
     "ranks": [{"rng": {"cpu": "<base64>"}, "data": {"epoch": 0, "step": 12, ...}}, ...],
     "files": {".metadata": {"bytes": 73940, "sha256": "..."}, "__0_0.distcp": {...}}}

It holds every small piece of state a resume needs, as JSON (nothing here is unpickled), and the
size and SHA-256 of every other file of the folder. At load each file is checked against it before
DCP reads anything, so a flipped byte in tensor data, a truncated, zeroed or missing file, or an
empty folder is found and the resume falls back to an older checkpoint. The hashing is split over
the ranks (rank r hashes files r, r + W, ...), at save and at load: the full Pi0.5's ~40 GB of
fp32 weights and Adam moments are ~5 GB per rank on 8 GPUs.
"""
from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from datakit.durable import file_sha256, write_atomic
from trainkit.parallel.ranks import all_gather, broadcast, rank_world

MANIFEST_NAME = "trainkit.json"
FORMAT, VERSION = "trainkit-checkpoint", 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DamagedCheckpoint(Exception):
    """A checkpoint folder does not match its manifest, or has none; `str()` says how."""


@dataclass
class Manifest:
    step: int  # optimiser steps done
    world_size: int
    global_batch: int
    dataset: dict[str, Any]  # the dataset's identity (trainkit/checkpoint/resume_rules.py)
    config: dict[str, Any]
    sched: dict[str, Any]
    ranks: list[dict[str, Any]]  # per rank: RNG states and loader position
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"bytes", "sha256"}


def rng_state() -> dict[str, str]:
    """This process's torch RNG states (CPU, and CUDA once initialised), base64 for JSON."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return {k: base64.b64encode(v.numpy().tobytes()).decode() for k, v in states.items()}


def set_rng_state(states: dict[str, str]) -> None:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)

    torch.set_rng_state(tensor(states["cpu"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensor(states["cuda"]))


def _hash(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": file_sha256(folder / n)} for n in names}


def seal(folder: Path, manifest: Manifest, rank_state: dict[str, Any]) -> None:
    """Hash every file of `folder` (this rank its share), gather each rank's state, and write the
    manifest on rank 0 (collective: every rank calls it after DCP has written the folder)."""
    rank, world = rank_world()
    names = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST_NAME) if rank == 0 else []
    names = broadcast(names)
    shares = all_gather((rank_state, _hash(folder, names[rank::world])))
    if rank == 0:
        manifest.ranks = [state for state, _ in shares]
        manifest.files = {k: v for _, hashed in shares for k, v in sorted(hashed.items())}
        body = {"format": FORMAT, "version": VERSION, **asdict(manifest)}
        write_atomic(folder / MANIFEST_NAME, (json.dumps(body, indent=1) + "\n").encode())


def read_manifest(folder: Path) -> Manifest:
    """The manifest of `folder`, checked for shape; DamagedCheckpoint when missing or malformed."""
    path = folder / MANIFEST_NAME
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise DamagedCheckpoint(f"no {MANIFEST_NAME} (an incomplete checkpoint, or not written by trainkit)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise DamagedCheckpoint(f"{MANIFEST_NAME} is unreadable ({type(e).__name__})") from None
    try:
        assert isinstance(raw, dict) and raw.pop("format") == FORMAT and raw.pop("version") == VERSION
        m = Manifest(**raw)
        ints = (m.step, m.world_size, m.global_batch)
        assert all(type(v) is int for v in ints) and m.step >= 0 and m.world_size >= 1 and m.global_batch >= 1
        assert all(isinstance(v, dict) for v in (m.dataset, m.config, m.sched, m.files))
        assert isinstance(m.ranks, list) and len(m.ranks) == m.world_size and all(isinstance(r, dict) for r in m.ranks)
        for name, f in m.files.items():
            assert _plain_name(name) and isinstance(f, dict) and type(f.get("bytes")) is int
            assert isinstance(f.get("sha256"), str) and _SHA256.match(f["sha256"])
    except (AssertionError, KeyError, TypeError):
        raise DamagedCheckpoint(f"{MANIFEST_NAME} is not a trainkit checkpoint manifest") from None
    return m


def _plain_name(name: Any) -> bool:
    """A file name inside the folder: no separator, not '.', '..' or the manifest itself."""
    return isinstance(name, str) and name not in ("", ".", "..", MANIFEST_NAME) and "/" not in name \
        and "\\" not in name and "\0" not in name


def check_files(folder: Path, manifest: Manifest) -> None:
    """Every file the manifest lists has its size and SHA-256 (each rank checks its share; every
    rank gets the same verdict). DamagedCheckpoint naming the first file that does not."""
    rank, world = rank_world()
    names = sorted(manifest.files)
    problems = [p for n in names[rank::world] if (p := _file_problem(folder / n, manifest.files[n]))]
    found = sorted(p for share in all_gather(problems) for p in share)
    if found:
        raise DamagedCheckpoint(found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""))


def _file_problem(path: Path, want: dict[str, Any]) -> str | None:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as e:
        return f"{path.name} is unreadable ({e.strerror})"
    if size != want["bytes"]:
        return f"{path.name} has {size} bytes, its manifest says {want['bytes']}"
    try:
        digest = file_sha256(path)
    except OSError as e:
        return f"{path.name} is unreadable ({e.strerror})"
    return None if digest == want["sha256"] else f"{path.name} does not match its sha256 in the manifest"

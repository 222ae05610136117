"""Helpers for the trainkit tests: a tiny-preset config over the loader's shard fixture, and a
runner that trains in N gloo processes (FSDP2 works on CPU with gloo) and returns rank 0's
results. Several runs share one process group, so the suite pays the process start-up once.
"""
from __future__ import annotations

import os
import pickle
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from trainkit.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "trainkit" / "configs" / "pi05_tiny.toml"


def tiny_config(shards: Path, out: Path, *overrides: str, config: Path = TINY) -> RunConfig:
    """`config` (pi05_tiny.toml) over `shards`, writing to `out`, CPU-fast, with `key=value` overrides."""
    base = [f"data.shards={shards}", f"output.dir={out}", "output.progress=false", "data.num_workers=0"]
    return load_config(config, [*base, *overrides])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cfgs: list[RunConfig], result_path: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from trainkit.train import run

    results = []
    for cfg in cfgs:
        try:
            r = run(cfg)
            results.append({"losses": r.losses, "history": r.history, "applied": r.plan.applied,
                            "units": len(r.plan.units), "start_step": r.start_step,
                            "all_gathers_per_step": r.plan.all_gathers_per_step})
        except Exception as e:  # noqa: BLE001 - returned to the test, which asserts on it
            results.append({"error": f"{type(e).__name__}: {e}"})
    if rank == 0:
        Path(result_path).write_bytes(pickle.dumps(results))
    if dist.is_initialized():
        dist.destroy_process_group()


def run_distributed(cfgs: list[RunConfig], world: int = 2) -> list[dict[str, Any]]:
    """Train each config in turn on `world` gloo processes; rank 0's result per config."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "results.pkl")
        mp.start_processes(_worker, args=(world, _free_port(), cfgs, path), nprocs=world, start_method="spawn")
        return pickle.loads(Path(path).read_bytes())

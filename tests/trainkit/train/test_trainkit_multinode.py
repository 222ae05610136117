"""`trainkit run` across nodes, simulated on this machine: two torchrun launches with
`--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d` on 127.0.0.1 (gloo, tiny preset) against one
launch with `--nproc-per-node 2`, same seed and global batch (docs/multi-node.md).

Checks: (a) the per-step losses of the two-node job equal the one-node job's (metrics.jsonl);
(b) with `output.record_samples` each rank logs the rows it trained on: in every step the ranks'
rows are disjoint, fill the global batch, are the same sets as the one-node job's, and no row
repeats within the epoch. Every launch runs under a subprocess timeout, so a rendezvous that
never completes fails the test instead of hanging CI.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import ROOT, TINY

STEPS, MICRO, GLOBAL = 3, 4, 16  # 2 ranks x 4 samples x 2 micro-batches per step; 48 of 81 samples
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trainkit_args(shards: Path, out: Path) -> list[str]:
    sets = [f"data.shards={shards}", f"output.dir={out}", "output.progress=false", "data.num_workers=0",
            f"train.steps={STEPS}", f"train.micro_batch={MICRO}", f"train.global_batch={GLOBAL}",
            "output.log_every=1", "output.record_samples=true", "optim.schedule=constant"]
    return ["-m", "trainkit.cli", "run", str(TINY), *[a for s in sets for a in ("--set", s)]]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _wait(procs: list[subprocess.Popen]) -> None:
    """Wait for every launch; on a timeout kill them all and fail with their output."""
    try:
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate()[0] for p in procs]
        pytest.fail(f"torchrun did not finish in {TIMEOUT_S} s:\n" + "\n---\n".join(o[-3000:] for o in outs))
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]


def _losses(out: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if r["kind"] == "step"}


def _rows(out: Path, rank: int) -> dict[int, list[int]]:
    """step -> the rows rank `rank` trained on in that step (all micro-batches)."""
    per_step: dict[int, list[int]] = {}
    for line in (out / f"samples-rank{rank}.jsonl").read_text().splitlines():
        r = json.loads(line)
        per_step.setdefault(r["step"], []).extend(r["rows"])
    return per_step


@pytest.mark.timeout(2 * TIMEOUT_S + 30)
def test_two_node_c10d_launch_matches_one_node_and_ranks_read_disjoint_batches(shards_rgb, tmp_path):  # noqa: F811
    one, two = tmp_path / "one_node", tmp_path / "two_nodes"
    single = subprocess.Popen(
        _torchrun("--standalone", "--nproc-per-node", "2", *_trainkit_args(shards_rgb, one)),
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait([single])

    port = _free_port()
    nodes = [subprocess.Popen(
        _torchrun("--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "multinode-test",
                  # node 0 hosts the rendezvous store; on one machine both would match 127.0.0.1
                  "--rdzv-conf", f"is_host={int(node == 0)}", "--max-restarts", "0",
                  *_trainkit_args(shards_rgb, two)),
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    _wait(nodes)

    # (a) the same losses, step for step: same ranks, same data, same reductions
    assert list(_losses(two)) == list(range(STEPS))
    assert _losses(two) == _losses(one)

    # (b) each rank a disjoint part of each global batch, the same parts as on one node
    for out in (one, two):
        r0, r1 = _rows(out, 0), _rows(out, 1)
        assert sorted(r0) == sorted(r1) == list(range(STEPS))
        seen: set[int] = set()
        for step in range(STEPS):
            assert len(r0[step]) == len(r1[step]) == GLOBAL // 2
            batch = set(r0[step]) | set(r1[step])
            assert len(batch) == GLOBAL  # disjoint and no duplicate inside a rank
            assert not batch & seen  # the epoch's order never repeats a sample
            seen |= batch
    for rank in (0, 1):
        assert _rows(two, rank) == _rows(one, rank)


@pytest.mark.timeout(300)
def test_resume_on_fewer_then_more_ranks_continues_the_global_order(shards_rgb, tmp_path):  # noqa: F811
    """A job checkpointed on 2 ranks resumes on 1 (micro-batches make up the global batch), is
    checkpointed again and resumes on 4: every step trains on the samples of the unbroken 2-rank
    run's step. The model and optimiser are resharded by DCP; losses stay finite."""
    from trainkit_harness import run_distributed, tiny_config

    steps, gb = 6, 8
    common = ("output.log_every=1", "output.record_samples=true", "optim.schedule=constant",
              f"train.global_batch={gb}", "output.checkpoint_every=2")
    unbroken = tmp_path / "unbroken"
    broken = tmp_path / "broken"
    phases = [
        (2, [tiny_config(shards_rgb, unbroken, *common, f"train.steps={steps}", "train.micro_batch=4"),
             tiny_config(shards_rgb, broken, *common, "train.steps=2", "train.micro_batch=4")]),
        (1, [tiny_config(shards_rgb, broken, *common, "train.steps=4", "train.micro_batch=4")]),  # 2 micro-batches
        (4, [tiny_config(shards_rgb, broken, *common, f"train.steps={steps}", "train.micro_batch=2")]),
    ]
    results = []
    for world, cfgs in phases:
        results += run_distributed(cfgs, world=world)
    assert not [r["error"] for r in results if "error" in r]
    assert [r["start_step"] for r in results] == [0, 0, 2, 4]
    assert all(math.isfinite(x) for r in results for x in r["losses"].values())

    def per_step(out: Path, ranks: int) -> dict[int, list[int]]:
        got: dict[int, list[int]] = {}
        for rank in range(ranks):
            for step, rows in _rows(out, rank).items():
                got.setdefault(step, []).extend(rows)
        return got

    want, got = per_step(unbroken, 2), per_step(broken, 4)
    assert sorted(got) == sorted(want) == list(range(steps))
    for step in range(steps):
        assert len(got[step]) == len(set(got[step])) == gb  # disjoint ranks and micro-batches
        assert set(got[step]) == set(want[step]), step

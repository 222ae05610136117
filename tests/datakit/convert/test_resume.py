"""Atomic and resumable: kill -9 at any moment, rerun the same command, get the same bytes as an
unbroken run, without redoing the shards that were already complete."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("s") / "ds", version="v2.1", codec="h264",
                                episode_lengths=(30, 22, 41, 18, 35, 27, 33, 25), height=96, width=128)


def _cmd(src, out, workers=1):
    return [sys.executable, "-m", "datakit.cli", "convert", str(src), str(out), "--workers", str(workers),
            "--shard-size", "1MiB", "--no-progress"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run(_cmd(src, out), check=True, env=_env(), capture_output=True)
    return tree_bytes(out)


def _kill_when(src, out, ready, workers, timeout=120.0):
    """Start a conversion, SIGKILL it as soon as `ready(out)` holds, return whether it was killed."""
    p = subprocess.Popen(_cmd(src, out, workers), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while p.poll() is None and time.time() - t0 < timeout:
        if ready(out):
            p.send_signal(signal.SIGKILL)
            p.wait()
            return True
        time.sleep(0.005)
    p.wait()
    return False


def _staging(out):
    return out / ".datakit-staging"


def _journal_count(out) -> int:
    """Journals in the staging folder; 0 while it does not exist (a new run creates it, removes it
    and creates it again while setting up, so it can vanish between two looks)."""
    try:
        return sum(1 for _ in _staging(out).glob("*.journal"))
    except FileNotFoundError:
        return 0


KILL_POINTS = {
    # a shard is being written (mid-episode, most likely)
    "shard_tmp": lambda o: any(o.glob("shard-*.tar.tmp")),
    # right after the first shard was journaled
    "first_journal": lambda o: (_staging(o) / "shard-000000.journal").exists(),
    # later: two shards journaled (with two workers, not necessarily shards 0 and 1)
    "two_journals": lambda o: _journal_count(o) >= 2,
}


CASES = [(p, w) for p in sorted(KILL_POINTS) for w in (1, 2)]


@pytest.mark.parametrize("point,workers", CASES)
def test_kill9_then_rerun_gives_identical_bytes(src, reference, tmp_path, point, workers):
    """Killed anywhere, with one worker or two (two shards being written at once), and rerun
    with the other worker count: the result equals the unbroken run, byte for byte."""
    out = tmp_path / "out"
    killed = _kill_when(src, out, KILL_POINTS[point], workers)
    assert killed, f"the conversion finished before reaching {point}"
    assert not (out / "index.json").exists()  # nothing that looks finished
    journaled = {p.name.replace(".journal", ".tar") for p in (out / ".datakit-staging").glob("*.journal")}
    kept = {n: (out / n).stat().st_mtime_ns for n in journaled}
    r = subprocess.run(_cmd(src, out, 3 - workers), env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(out) == reference
    assert not (out / ".datakit-staging").exists()
    if point in ("first_journal", "two_journals"):
        assert kept and "resumed" in r.stdout
    for name, mtime in kept.items():  # journaled shards were kept, not rewritten
        assert (out / name).stat().st_mtime_ns == mtime, name

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
from tests.helpers import tree_bytes

ROOT = Path(__file__).resolve().parents[1]


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


KILL_POINTS = {
    # mid-episode: a fragment is being written (workers > 1)
    "first_fragment_tmp": lambda o: any(_staging(o).glob("*.frag.tmp")) if _staging(o).exists() else False,
    # a shard is being assembled
    "shard_tmp": lambda o: any(o.glob("shard-*.tar.tmp")),
    # right after the first shard was journaled
    "first_journal": lambda o: (_staging(o) / "shard-000000.journal").exists(),
    # later: two shards done
    "second_shard": lambda o: (o / "shard-000001.tar").exists(),
}


CASES = [(p, 1) for p in sorted(KILL_POINTS) if p != "first_fragment_tmp"] + [(p, 2) for p in sorted(KILL_POINTS)]


@pytest.mark.parametrize("point,workers", CASES)
def test_kill9_then_rerun_gives_identical_bytes(src, reference, tmp_path, point, workers):
    """workers=1 writes episodes straight into the shard; workers=2 goes through fragments.
    Both, killed anywhere and rerun (with the other worker count), equal the unbroken run."""
    out = tmp_path / "out"
    killed = _kill_when(src, out, KILL_POINTS[point], workers)
    assert killed, f"the conversion finished before reaching {point}"
    assert not (out / "index.json").exists()  # nothing that looks finished
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    r = subprocess.run(_cmd(src, out, 3 - workers), env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(out) == reference
    assert not (out / ".datakit-staging").exists()
    if point in ("first_journal", "second_shard"):  # complete shards were kept, not rewritten
        assert "resumed" in r.stdout
        assert (out / "shard-000000.tar").stat().st_mtime_ns == kept["shard-000000.tar"]

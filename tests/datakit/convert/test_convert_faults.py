"""Faults while converting: the output cannot be written (EFBIG by RLIMIT_FSIZE, ENOSPC on a
small tmpfs), a pool worker is killed, the run gets SIGTERM, a background-thread consumer gives up.
Each must end the run within seconds, with one line naming the problem, never a partial shard,
and a rerun must give the bytes of an unbroken run. Every wait is under a timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from datakit.stages.background import in_background
from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes

ROOT = Path(__file__).resolve().parents[3]
LENGTHS = (8, 12, 6, 10)
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# Runs the CLI with RLIMIT_FSIZE (soft) set at the start, or only once the shards are done
# (right before the index files are written), so the limit hits the file we aim at.
LIMITED = """
import resource, sys
import datakit.convert.run as c
from datakit.cli import main
limit, when = int(sys.argv[1]), sys.argv[2]
def set_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
if when == "start":
    set_limit()
else:
    real = c.write_index
    def late(*a, **k):
        set_limit()
        return real(*a, **k)
    c.write_index = late
sys.exit(main(sys.argv[3:]))
"""


def _args(src, out, workers=1, *extra):
    return ["convert", str(src), str(out), "--workers", str(workers), "--shard-size", "1", "--no-progress", *extra]


def _run(args, limit=None, when="start", timeout=120):
    cmd = [sys.executable, "-c", LIMITED, str(limit), when, *args] if limit else \
        [sys.executable, "-m", "datakit.cli", *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("s") / "ds", version="v2.1", episode_lengths=LENGTHS,
                                height=64, width=96, codec="h264")


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    r = _run(_args(src, out))
    assert r.returncode == 0, r.stderr
    return out


def _one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _no_partial_shard(out: Path, reference: Path) -> None:
    """Every committed shard is the unbroken run's shard, byte for byte; no .tmp is left."""
    assert not list(out.glob("*.tmp")), list(out.glob("*.tmp"))
    for shard in out.glob("shard-*.tar"):
        assert shard.read_bytes() == (reference / shard.name).read_bytes(), shard.name


def _resumes_to_reference(src, out, reference, workers=1) -> str:
    r = _run(_args(src, out, workers))
    assert r.returncode == 0, r.stderr
    assert tree_bytes(out) == tree_bytes(reference)
    return r.stdout


# ---- output errors ---------------------------------------------------------------------------

def _shard_size(reference, i):
    return (reference / f"shard-{i:06d}.tar").stat().st_size


@pytest.mark.timeout(240)
@pytest.mark.parametrize("where,workers", [("first_shard", 1), ("second_shard", 2)])
def test_file_too_large_while_writing_a_shard(src, reference, tmp_path, workers, where):
    """EFBIG inside a shard, even under --on-error skip: exit 2, one line naming the file and
    EFBIG, no episode listed as skipped, no partial shard; the rerun resumes."""
    # second_shard: shard 0 (8 frames) fits exactly, shard 1 (12 frames) does not
    limit = 100_000 if where == "first_shard" else _shard_size(reference, 0)
    assert _shard_size(reference, 1) > limit
    out = tmp_path / "out"
    r = _run(_args(src, out, workers, "--on-error", "skip"), limit)
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = _one_line(r)
    assert str(out / "shard-0000") in line and "EFBIG" in line and ".parquet" not in line, line
    assert not (out / "index.json").exists() and "skipped" not in r.stdout
    _no_partial_shard(out, reference)
    _resumes_to_reference(src, out, reference, workers)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("target", ["frames.arrow", "index.json"])
def test_file_too_large_while_writing_the_index(src, reference, tmp_path, target):
    sizes = {n: (reference / n).stat().st_size for n in ("frames.arrow", "index.json")}
    if target == "frames.arrow":
        limit = sizes["frames.arrow"] // 2
    else:  # frames.arrow fits, index.json does not
        assert sizes["index.json"] > sizes["frames.arrow"], sizes
        limit = sizes["frames.arrow"]
    out = tmp_path / "out"
    r = _run(_args(src, out, 1, "--on-error", "skip"), limit, when="index")
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = _one_line(r)
    assert str(out / target) in line and "EFBIG" in line, line
    assert not (out / "checksums.json").exists() and not (out / "index.json").exists()
    _no_partial_shard(out, reference)
    printed = _resumes_to_reference(src, out, reference)
    assert f"kept {len(LENGTHS)} complete shard" in printed


@pytest.mark.timeout(240)
def test_disk_full_on_a_small_tmpfs(src, reference, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    size = _shard_size(reference, 0) + _shard_size(reference, 1) // 2
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = mnt / "out"
        r = _run(_args(src, out, 2, "--on-error", "skip"))
        assert r.returncode == 2, (r.stdout, r.stderr)
        line = _one_line(r)
        assert str(out) in line and "ENOSPC" in line and ".parquet" not in line, line
        _no_partial_shard(out, reference)
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        _resumes_to_reference(src, out, reference, 2)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# ---- dead workers and signals ----------------------------------------------------------------

def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def _start(src, out, workers):
    return subprocess.Popen([sys.executable, "-m", "datakit.cli", *_args(src, out, workers)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(p, ready, timeout=60.0) -> None:
    t0 = time.time()
    while not ready():
        if p.poll() is not None or time.time() - t0 > timeout:
            p.kill()
            pytest.fail(f"the conversion ended before the point to interrupt it: {p.communicate()}")
        time.sleep(0.002)


def _gone(pids: list[int], timeout=10.0) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(180)
def test_killed_worker_fails_fast_naming_the_shard(src, reference, tmp_path):
    """kill -9 of one pool worker (the OOM killer): the run ends within seconds (it used to wait
    forever), names the shard(s) in flight, and the rerun gives the unbroken run's bytes."""
    out = tmp_path / "out"
    p = _start(src, out, 2)
    _wait_for(p, lambda: any(out.glob("shard-*.tar.tmp")) and len(_children(p.pid)) >= 2)
    victim = _children(p.pid)[0]
    os.kill(victim, signal.SIGKILL)
    t0 = time.time()
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the conversion hung after a worker was killed")
    assert time.time() - t0 < 30
    assert p.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert "worker process died" in line and "shard" in line and "Traceback" not in err, err
    _no_partial_shard(out, reference)
    _resumes_to_reference(src, out, reference, 2)


@pytest.mark.timeout(180)
def test_workers_die_with_a_killed_parent(src, reference, tmp_path):
    """kill -9 of the parent: no orphan worker goes on writing into OUT beside a rerun."""
    out = tmp_path / "out"
    p = _start(src, out, 2)
    _wait_for(p, lambda: any(out.glob("shard-*.tar.tmp")) and len(_children(p.pid)) >= 2)
    kids = _children(p.pid)
    p.kill()
    p.communicate(timeout=30)
    assert _gone(kids, timeout=5), "pool workers outlived their killed parent"
    _resumes_to_reference(src, out, reference, 2)


@pytest.mark.timeout(180)
def test_sigterm_stops_cleanly_and_resumes(src, reference, tmp_path, workers=2):
    out = tmp_path / "out"
    p = _start(src, out, workers)
    _wait_for(p, lambda: (out / ".datakit-staging" / "shard-000000.journal").exists())
    kids = _children(p.pid)
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("SIGTERM did not stop the conversion")
    assert p.returncode == 143, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "SIGTERM" in lines[0], err  # no BrokenPipe / worker tracebacks
    assert _gone(kids), "worker processes outlived the run"
    _no_partial_shard(out, reference)
    assert not (out / "index.json").exists()
    assert "resumed" in _resumes_to_reference(src, out, reference, 3 - workers)


# ---- in_background ----------------------------------------------------------------------------

def _consume_one_then_stop(items, depth):
    it = in_background(items, depth=depth)
    first = next(it)
    time.sleep(0.3)  # the producer is done and blocked on a full queue
    it.close()  # the consumer gives up: must not wait forever for the producer
    return first


@pytest.mark.timeout(20)
def test_in_background_consumer_stops_while_producer_waits_to_end():
    done = threading.Event()
    result = []

    def run():
        result.append(_consume_one_then_stop(iter([1, 2]), depth=1))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "in_background hung: the producer blocked putting its end marker"
    assert result == [1]


@pytest.mark.timeout(20)
def test_in_background_consumer_stops_while_producer_waits_to_raise():
    def items():
        yield 1
        yield 2
        raise OSError("disk gone")

    done = threading.Event()
    threading.Thread(target=lambda: (_consume_one_then_stop(items(), depth=1), done.set()), daemon=True).start()
    assert done.wait(10), "in_background hung: the producer blocked handing over its error"


def test_in_background_still_delivers_everything_and_errors():
    assert list(in_background(iter(range(50)), depth=2)) == list(range(50))

    def bad():
        yield 1
        raise ValueError("boom")

    got = []
    with pytest.raises(ValueError, match="boom"):
        for x in in_background(bad(), depth=1):
            got.append(x)
    assert got == [1]



@pytest.mark.timeout(120)
def test_read_only_output(src, tmp_path):
    """EROFS: one line naming OUT and the errno, not a traceback."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (mnt / "out").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        r = _run(_args(src, mnt / "out"))
        assert r.returncode == 2, r.stderr
        line = _one_line(r)
        assert str(mnt / "out") in line and "EROFS" in line, line
    finally:
        subprocess.run(["umount", "-l", str(mnt)])

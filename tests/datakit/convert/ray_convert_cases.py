"""`datakit convert --engine ray` (run in a pytest process of its own by test_convert_ray.py: a Ray driver no
longer forks safely): the same bytes as `--engine local` (one task per shard, and
one task per episode below the shard), the same bytes after Ray retried a task whose worker
was SIGKILLed, a driver killed mid-run resumes from OUT's journals, errors stop the run.

Skipped cleanly without ray (`pip install .[ray]`). One Ray session (2 CPUs) serves the whole
module: starting Ray costs 10-30 s on a loaded 2-core machine. The oracle is the local engine
with one worker, one writer (its own tests check it against PyAV and tarfile)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import datakit.progress as progress_mod
from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.convert.fault_hooks import KILL_ONCE_ENV
from datakit.errors import ConfigError, DatakitError, SourceError
from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes

ROOT = Path(__file__).resolve().parents[3]
LENGTHS = (9, 14, 6, 11, 8, 12)
ONE_PER_EPISODE = 1  # --shard-size 1 byte: every episode closes its shard, 6 shards
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    # Idle workers are kept (Ray's default soft limit, num_cpus, would kill this job's idle workers
    # while another driver's run), so no test pays a second start-up of a worker (imports torch).
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", configure_logging=True,
             _system_config={"num_workers_soft_limit": 8})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("s") / "ds", version="v2.1", codec="h264",
                                episode_lengths=LENGTHS, height=64, width=96)


@pytest.fixture(scope="module")
def local(src, tmp_path_factory):
    """--engine local, one worker: the reference bytes, per shard size."""
    refs = {}
    for name, size in (("shards", ONE_PER_EPISODE), ("one", 1 << 30)):
        out = tmp_path_factory.mktemp("local") / name
        convert(src, out, ConvertConfig(workers=1, shard_size=size, progress=False))
        refs[name] = tree_bytes(out)
    assert len([k for k in refs["shards"] if k.endswith(".tar")]) == len(LENGTHS)
    assert len([k for k in refs["one"] if k.endswith(".tar")]) == 1
    return refs


class RecordingBar(progress_mod._Bar):
    updates: list[int] = []

    def update(self, n=1):
        RecordingBar.updates.append(n)
        return super().update(n)


@pytest.mark.parametrize("plan,killed", [("shards", "shard"), ("one", "episode"), ("one", "join")])
def test_same_bytes_as_local_after_a_killed_task(ray_session, src, local, tmp_path, monkeypatch, plan, killed):
    """shards: six shards, one Ray task each; one: a one-shard plan, split into one task per
    episode plus a join task. One task of the `killed` kind SIGKILLs its own worker once (a
    shard task after its first episode, an episode task after writing its part, the join task
    before its commit); Ray retries it and the output is the local engine's, byte for byte.
    The bar is fed by task completions: a shard's frames, or an episode's."""
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ONCE_ENV, f"{killed}:{marker}")
    RecordingBar.updates = []
    monkeypatch.setattr(progress_mod, "_Bar", RecordingBar)
    out = tmp_path / "out"
    s = convert(src, out, ConvertConfig(workers=2, engine="ray", progress=False,
                                        shard_size=ONE_PER_EPISODE if plan == "shards" else 1 << 30))
    assert marker.exists(), "no task killed its worker: the retry was not exercised"
    assert tree_bytes(out) == local[plan]
    assert sorted(RecordingBar.updates) == sorted(LENGTHS) and s.index.num_frames == sum(LENGTHS)
    assert not (out / ".datakit-staging").exists()


def _cli(src, out, address):
    return [sys.executable, "-m", "datakit.cli", "convert", str(src), str(out), "--engine", "ray",
            "--ray-address", address, "--shard-size", "1", "--no-progress"]


def _journaled(out: Path) -> bool:
    """Whether the run has journaled a shard in OUT's staging folder (which may come or go meanwhile)."""
    try:
        return any((out / ".datakit-staging").glob("shard-*.journal"))
    except FileNotFoundError:  # the folder went between glob's listing and its scan
        return False


def _signal_once_journaled(p: subprocess.Popen, out: Path, signum: int) -> bool:
    """Send `signum` to the driver `p` once OUT journals its first shard (within 180 s); whether it was sent."""
    t0 = time.time()
    while p.poll() is None and time.time() - t0 < 180:
        if _journaled(out):
            p.send_signal(signum)
            return True
        time.sleep(0.005)
    return False


def test_killed_driver_resumes_from_out(ray_session, src, local, tmp_path):
    """A driver joined to the cluster (--ray-address) is SIGKILLed once its first shard is
    journaled; the rerun keeps the committed shards (read from OUT's journals) and ends with
    the local engine's bytes."""
    out = tmp_path / "out"
    address = ray_session.get_runtime_context().gcs_address
    p = subprocess.Popen(_cli(src, out, address), env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = _signal_once_journaled(p, out, signal.SIGKILL)
    _, err = p.communicate(timeout=30)
    assert killed, f"the driver finished or failed before a shard was journaled: {err[-2000:]}"
    assert not (out / "index.json").exists()
    s = convert(src, out, ConvertConfig(workers=2, engine="ray", shard_size=ONE_PER_EPISODE, progress=False))
    assert 1 <= s.resumed_shards < len(LENGTHS)
    assert tree_bytes(out) == local["shards"]


def test_bad_episode_stops_the_run_or_is_skipped(ray_session, src, tmp_path):
    """--on-error fail: the task's own error (not retried) names the file; nothing that looks
    finished is left, and no task's private files. --on-error skip: the local engine's bytes."""
    import shutil

    bad = tmp_path / "ds"
    shutil.copytree(src, bad)
    (bad / "videos/chunk-000/observation.images.top/episode_000003.mp4").write_bytes(b"\x00junk" * 500)
    for size in (ONE_PER_EPISODE, 1 << 30):
        out = tmp_path / f"out-{size}"
        with pytest.raises(SourceError, match="episode_000003.mp4"):
            convert(bad, out, ConvertConfig(workers=2, engine="ray", shard_size=size, progress=False))
        names = [p.name for p in out.rglob("*")]
        assert "index.json" not in names and "shard-000003.tar" not in names, names
        assert not any(n.endswith(".tmp") or n.endswith(".part") for n in names), names
        assert not (out / ".datakit-staging" / "tasks").exists()
        skipped, local_skip = tmp_path / f"skip-{size}", tmp_path / f"local-skip-{size}"
        convert(bad, skipped, ConvertConfig(workers=2, engine="ray", shard_size=size, on_error="skip", progress=False))
        convert(bad, local_skip, ConvertConfig(workers=1, shard_size=size, on_error="skip", progress=False))
        assert tree_bytes(skipped) == tree_bytes(local_skip)


def test_task_larger_than_any_node_is_refused(ray_session, src, tmp_path):
    """A task asking more CPUs or memory than any node has would wait forever in Ray: one clear error."""
    with pytest.raises(DatakitError, match="ray_cpus_per_task = 3"):
        convert(src, tmp_path / "out", ConvertConfig(workers=2, engine="ray", ray_cpus_per_task=3, progress=False))
    with pytest.raises(DatakitError, match="ray_memory_per_task = 1000000000000000 bytes"):
        convert(src, tmp_path / "out", ConvertConfig(workers=2, engine="ray", ray_memory_per_task=10**15, progress=False))


def test_without_ray_the_error_says_how_to_install(src, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(DatakitError, match=r"pip install 'robodata\[ray\]'"):
        convert(src, tmp_path / "out", ConvertConfig(workers=2, engine="ray", progress=False))


def test_engine_and_resources_from_toml(tmp_path):
    """The engine fields come from the [convert] table, and none of them is an output option
    (a run may be resumed with the other engine)."""
    toml = tmp_path / "c.toml"
    toml.write_text('[convert]\nengine = "ray"\nray_address = "10.0.0.1:6379"\nray_cpus_per_task = 2\n'
                    'ray_memory_per_task = 4294967296\n')
    cfg = ConvertConfig.from_toml(toml)
    assert (cfg.engine, cfg.ray_address, cfg.ray_cpus_per_task, cfg.ray_memory_per_task) == \
        ("ray", "10.0.0.1:6379", 2, 4 << 30)
    assert cfg.output_options() == ConvertConfig().output_options()
    with pytest.raises(ConfigError, match="engine"):
        ConvertConfig(engine="spark")


class FakeRay:
    """Records how the engine starts Ray (the real start is exercised by the CLI runs above and
    costs 5-30 s here, so the arguments are checked on a recorder)."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.up = False

    def is_initialized(self):
        return self.up

    def init(self, **kw):
        self.calls.append(("init", kw))
        self.up = True

    def shutdown(self):
        self.calls.append(("shutdown", {}))
        self.up = False


def test_connect_starts_local_ray_or_joins_a_cluster(monkeypatch):
    from datakit.convert.engines import ray as ray_engine
    from datakit.convert.engines.ray import connect

    probed = []
    monkeypatch.setattr(ray_engine, "check_ray_address", probed.append)  # no cluster at these addresses
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = FakeRay()
    assert connect(fake, ConvertConfig(workers=3, engine="ray")) is True
    (what, kw), = fake.calls
    assert what == "init" and kw["num_cpus"] == 3 and kw["include_dashboard"] is False and "address" not in kw
    assert connect(fake, ConvertConfig(workers=3, engine="ray")) is False  # a session already up is used as is

    fake = FakeRay()
    assert connect(fake, ConvertConfig(workers=3, engine="ray", ray_address="10.0.0.1:6379")) is True
    (what, kw), = fake.calls
    assert kw["address"] == "10.0.0.1:6379" and "num_cpus" not in kw

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    fake = FakeRay()
    connect(fake, ConvertConfig(workers=3, engine="ray"))
    assert fake.calls[0][1]["address"] == "10.0.0.2:6379"
    assert probed == ["10.0.0.1:6379", "10.0.0.2:6379"]  # an address is checked before ray.init waits on it


# --- issue 14 item 2: a dead address fails fast; SIGTERM exits 143 ------------------------------
@pytest.mark.parametrize("address", ["127.0.0.1:1", "nohost.invalid:6379"])
def test_dead_address_fails_within_30_s_naming_it(src, tmp_path, address):
    """ray.init waited for the GCS without a deadline (400 s+): one line naming the address, exit 2."""
    pytest.importorskip("ray")
    p = subprocess.run(_cli(src, tmp_path / "out", address), env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=30)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and address in err[0], p.stderr[-2000:]


def _listening():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def test_a_stalled_or_foreign_server_is_refused_within_the_timeout():
    import threading

    from datakit.convert.engines.ray_address import check_ray_address

    stalled, address = _listening()  # accepts connections (the kernel's backlog), never answers
    with stalled, pytest.raises(DatakitError, match=f"--ray-address {address}: .*does not answer within 0.5 s"):
        check_ray_address(address, timeout=0.5)

    http, address = _listening()  # answers, but not as a GCS (e.g. the dashboard's port)

    def serve():
        c, _ = http.accept()
        c.recv(1024)
        c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with http, pytest.raises(DatakitError, match=f"--ray-address {address}: the server there is not a Ray GCS"):
        check_ray_address(address, timeout=5)
    t.join(5)


def test_a_live_gcs_passes_the_check(ray_session):
    from datakit.convert.engines.ray_address import check_ray_address

    check_ray_address(ray_session.get_runtime_context().gcs_address, timeout=10)


def test_sigterm_of_a_ray_run_exits_143_with_the_usual_line(ray_session, src, tmp_path):
    """ray.init installs a SIGTERM handler that exits 15 (with Ray's C++ dump): the driver keeps
    datakit's, stops its tasks and exits 143 with the line a local run prints."""
    out = tmp_path / "out"
    address = ray_session.get_runtime_context().gcs_address
    p = subprocess.Popen(_cli(src, out, address), env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sent = _signal_once_journaled(p, out, signal.SIGTERM)
    _, err = p.communicate(timeout=90)
    assert sent, f"the driver finished or failed before a shard was journaled: {err[-2000:]}"
    lines = err.strip().splitlines()
    assert p.returncode == 143, err[-3000:]
    assert lines[-1] == "datakit convert: terminated (SIGTERM); rerun the same command to resume", err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    assert not (out / "index.json").exists()

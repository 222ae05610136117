"""`trainkit run` when the machine, the user or a scheduler gets in the way (issue 25, items 15, 16,
the SIGTERM handler and metrics.jsonl after a resume).

- A full disk at a checkpoint save (ENOSPC, simulated where DCP opens its files, or where the
  manifest is written): one line naming the folder and ENOSPC, exit 2, no half-written folder,
  and the previous checkpoint intact: a rerun resumes from it with the unbroken run's losses.
  The simulation raises what the kernel does: a partial write, then OSError(ENOSPC) (on a real
  full tmpfs torch.save turns it into "unexpected pos 704 vs 598", the OSError as its context).
- An absurd model size (`model.lm_mlp=1000000000`): refused before anything is allocated, naming
  inspect's estimate (the oracle) and the memory it exceeds.
- SIGTERM: the step under way finishes, a checkpoint of it is written, one line, exit 143; a
  rerun resumes from that checkpoint with the losses of an unbroken run. Sent to the trainer, or
  to its whole process group (as Slurm does) with loader workers in it. Under torchrun a SIGTERM
  to one rank stops every rank at the same step.
- metrics.jsonl after a resume from an older checkpoint holds each step once.
"""
from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainkit_fixtures import base_run, cli_run, shards_rgb, step_lines  # noqa: F401 - fixtures
from trainkit_harness import ROOT, TINY

pytestmark = pytest.mark.timeout(240)


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


# --- 15: a full disk at a save ---------------------------------------------------------------------
class _FullDisk(io.FileIO):
    """A file on a disk with `ROOM` bytes left: the write that crosses it is cut short, the next fails."""

    ROOM = 600

    def write(self, b) -> int:
        room = self.ROOM - self.tell()
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(bytes(memoryview(b))[:room])


def _full_disk_for(monkeypatch, folder: str, where: str) -> None:
    """Every file DCP (`where="tensors"`) or trainkit (`"manifest"`) writes into `folder` hits a full disk."""
    if where == "tensors":
        from torch.distributed.checkpoint.filesystem import FileSystem

        real = FileSystem.create_stream

        @contextmanager
        def create_stream(self, path, mode):
            if folder not in str(path) or "w" not in mode:
                with real(self, path, mode) as stream:
                    yield stream
                return
            # a small buffer: torch.save's writes reach the full disk inside its zip writer, which
            # then fails with "unexpected pos 628 vs 598", the ENOSPC only as its __context__
            with io.BufferedWriter(_FullDisk(str(path), "w"), buffer_size=64) as stream:
                yield stream

        monkeypatch.setattr(FileSystem, "create_stream", create_stream)
    else:
        from trainkit.checkpoint import manifest

        real_write = manifest.write_atomic

        def write_atomic(path, data, **kw):
            if folder in str(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real_write(path, data, **kw)

        monkeypatch.setattr(manifest, "write_atomic", write_atomic)


@pytest.mark.parametrize("where", ["tensors", "manifest"])
def test_a_full_disk_at_a_save_is_one_line_and_keeps_the_older_checkpoint(base_run, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                                          where):
    out = tmp_path / "run"
    _full_disk_for(monkeypatch, "step-000004.tmp", where)
    # checkpoints at steps 2 (fits) and 4 (the disk is full); metrics lines every 10 steps, so the
    # steps done are logged only when the run ends, failed or not
    code, err = cli_run(capsys, *base_run.args(out, "output.log_every=10"))
    line = _one_line(err)
    assert code == 2 and str(out / "checkpoints" / "step-000004") in line and "ENOSPC" in line, line
    assert _checkpoints(out) == ["step-000002"]  # nothing half-written beside it
    assert [x["step"] for x in step_lines(out)] == [0, 1, 2, 3]
    monkeypatch.undo()  # space freed: the rerun resumes from the intact step 2
    code, err = cli_run(capsys, *base_run.args(out))
    assert code == 0 and "Traceback" not in err, err
    assert {x["step"]: x["loss"] for x in step_lines(out)} == {s: base_run.unbroken[s]["loss"] for s in range(6)}


# --- 16: an absurd model size ----------------------------------------------------------------------
def test_an_absurd_model_size_is_refused_before_anything_is_allocated(shards_rgb, tmp_path, capsys):  # noqa: F811
    import torch

    from trainkit.config import load_config
    from trainkit.estimate.inspect import inspect_model

    out = tmp_path / "run"
    sets = (f"data.shards={shards_rgb}", f"output.dir={out}", "model.lm_mlp=1000000000", "parallel.fsdp=none")
    code, err = cli_run(capsys, *sets)
    line = _one_line(err)
    cfg = load_config(TINY, [*sets, "output.progress=false", "data.num_workers=0"])
    estimate = inspect_model(cfg, world_size=1)["memory"]["peak_gib"]  # the oracle: inspect's own number
    from trainkit.estimate.inspect import device_memory

    _, limit = device_memory(torch.device("cpu"))
    assert estimate > 1000 > limit
    assert code == 2 and f"{estimate:.1f} GiB" in line and f"{limit:.1f} GiB" in line, line
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_the_limit_on_a_cpu_is_the_host_memory():
    import torch

    from trainkit.estimate.inspect import device_memory

    name, gib = device_memory(torch.device("cpu"))
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2 ** 30
    assert 0 < gib <= host and "host" in name


# --- the SIGTERM handler -----------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return env


def _sets(shards: Path, out: Path, *extra: str) -> list[str]:
    sets = [f"data.shards={shards}", f"output.dir={out}", "output.progress=false", "output.log_every=1",
            "output.checkpoint_every=5", "optim.schedule=constant", *extra]
    return [a for s in sets for a in ("--set", s)]


def _wait_for_step(out: Path, proc: subprocess.Popen, step: int, deadline_s: float = 150) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and any(f'"step": {step},' in x and '"kind": "step"' in x
                                    for x in metrics.read_text().splitlines()):
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended first: {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the run logged no step {step} in time: {proc.communicate()[1][-3000:]}")


@pytest.mark.parametrize("target", ["the_trainer", "its_process_group"])
def test_sigterm_checkpoints_the_last_step_and_exits_143(shards_rgb, tmp_path, capsys, target):  # noqa: F811
    out = tmp_path / "run"
    workers = "data.num_workers=2" if target == "its_process_group" else "data.num_workers=0"
    proc = subprocess.Popen([sys.executable, "-m", "trainkit.cli", "run", str(TINY),
                             *_sets(shards_rgb, out, "train.steps=1000", "parallel.fsdp=none", workers)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for_step(out, proc, 2)
        if target == "the_trainer":
            os.kill(proc.pid, signal.SIGTERM)
        else:  # the trainer and its loader workers, as Slurm and `kill -TERM -PGID` signal a job
            os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    line = _one_line(err)
    assert proc.returncode == 143 and "SIGTERM" in line, (proc.returncode, err)
    _stopped_then_resumed(capsys, shards_rgb, out, tmp_path, line)


def _stopped_then_resumed(capsys, shards, out: Path, tmp_path: Path, line: str) -> str:
    """A run stopped by a signal: every step once, the one under way finished and checkpointed (named
    in the stop's `line`); the rerun resumes from it as an unbroken run of as many steps (the oracle)
    trains, bit for bit. Returns the rerun's stderr (the Ctrl-C test reads its resume line)."""
    logged = [x["step"] for x in step_lines(out)]
    last = logged[-1]
    assert logged == list(range(last + 1)) and last >= 2  # every step once, the one under way finished
    final = f"step-{last + 1:06d}"
    assert _checkpoints(out)[-1] == final and final in line, (_checkpoints(out), line)
    assert json.loads((out / "checkpoints" / final / "trainkit.json").read_text())["step"] == last + 1
    steps = f"train.steps={last + 3}"
    code, err = cli_run(capsys, f"data.shards={shards}", f"output.dir={tmp_path / 'unbroken'}", steps,
                        "output.log_every=1", "optim.schedule=constant", "parallel.fsdp=none")
    assert code == 0, err
    code, err = cli_run(capsys, f"data.shards={shards}", f"output.dir={out}", steps, "output.log_every=1",
                        "output.checkpoint_every=5", "optim.schedule=constant", "parallel.fsdp=none")
    assert code == 0 and "Traceback" not in err, err
    resumed = step_lines(out)
    assert [x["step"] for x in resumed] == list(range(last + 3))
    assert [x["loss"] for x in resumed] == [x["loss"] for x in step_lines(tmp_path / "unbroken")]
    assert f"trainkit: resuming from {out / 'checkpoints' / final} (step {last + 1})" in err.splitlines(), err
    return err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_pids(parent: int) -> dict[int, int]:
    """rank -> pid of torchrun's workers (its children, by their RANK)."""
    pids: dict[int, int] = {}
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                env = dict(x.split("=", 1) for x in Path(f"/proc/{child}/environ").read_text().split("\0") if "=" in x)
            except OSError:
                continue
            if "RANK" in env:
                pids[int(env["RANK"])] = int(child)
    return pids


@pytest.mark.timeout(300)
def test_under_torchrun_a_sigterm_to_one_rank_stops_every_rank_at_the_same_step(shards_rgb, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                             "-m", "trainkit.cli", "run", str(TINY),
                             *_sets(shards_rgb, out, "train.steps=1000", "parallel.fsdp=block", "data.num_workers=0")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for_step(out, proc, 2)
        os.kill(_rank_pids(proc.pid)[1], signal.SIGTERM)  # rank 1 alone: rank 0 must stop with it
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    # the two ranks write their line at the same moment to one stderr: they may land glued together
    said = re.findall(r"trainkit: stopped by SIGTERM[^\n]*?resume from it", err)
    assert len(said) == 2 and said[0] == said[1], err[-3000:]
    # torchrun's report: rank 1 exits 143; so does rank 0, unless torchrun's own SIGTERM to the ranks
    # still running after the first exit reaches it after it printed its line and left the handler
    # (in the process group's shutdown): then -15, its checkpoint and line already written
    assert err.count("exitcode  : 143") + err.count("exitcode  : -15") == 2 and "exitcode  : 143" in err, err[-3000:]
    last = [x["step"] for x in step_lines(out)][-1]
    final = out / "checkpoints" / f"step-{last + 1:06d}"
    manifest = json.loads((final / "trainkit.json").read_text())
    assert manifest["step"] == last + 1 and manifest["world_size"] == 2 and final.name in said[0]


# --- metrics.jsonl after a resume --------------------------------------------------------------------
@pytest.mark.parametrize("cut", [False, True])
def test_metrics_after_a_resume_from_an_older_checkpoint_hold_each_step_once(base_run, tmp_path, capsys, cut):  # noqa: F811
    """The stopped run logged steps 0-3; its step-4 checkpoint is gone, so the rerun resumes at 2
    and trains 2 and 3 again; `cut`: a kill -9 had also cut the file's last line."""
    import shutil

    out = base_run.copy(tmp_path / "run")
    shutil.rmtree(out / "checkpoints" / "step-000004")
    if cut:
        with open(out / "metrics.jsonl", "a") as f:
            f.write('{"kind": "step", "step": 4, "lo')
    code, err = cli_run(capsys, *base_run.args(out))
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in rows if x["kind"] == "step"]
    intervals = [x["step"] for x in rows if x["kind"] == "interval"]
    assert steps == list(range(6)) and intervals == list(range(6))
    assert [x["loss"] for x in rows if x["kind"] == "step"] == [base_run.unbroken[s]["loss"] for s in range(6)]

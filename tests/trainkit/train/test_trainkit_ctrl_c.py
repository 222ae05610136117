"""Ctrl-C is SIGTERM for `trainkit run` (issue 35, item 3).

- The first SIGINT finishes the step under way, writes a checkpoint of it, prints one line and
  exits 130; sent to the trainer alone, or to its whole process group with loader workers in it
  (what a terminal's Ctrl-C does). The rerun prints `resuming from CHECKPOINT (step N)` and has the
  losses of an unbroken run of as many steps (the oracle), step for step.
- Under torchrun (2 gloo processes on the CPU) a Ctrl-C to torchrun's group (torchrun passes it on to
  each rank's own session) stops both ranks at the same step with one checkpoint, each rank exits
  130 with the same line, and a 2-process resume has the unbroken 2-process run's losses.
- A second SIGINT exits at once: the handler raises KeyboardInterrupt, the CLI prints one line, 130.
  Before the fix the first SIGINT printed an 11-line KeyboardInterrupt traceback and wrote no
  checkpoint of the step it stopped at.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_trainkit_run_hardening import (_checkpoints, _env, _free_port, _one_line, _sets, _stopped_then_resumed,
                                         _wait_for_step)
from trainkit_fixtures import cli_run, shards_rgb, step_lines  # noqa: F401 - fixtures
from trainkit_harness import TINY, run_distributed, tiny_config

pytestmark = pytest.mark.timeout(300)


def _stop(proc: subprocess.Popen, out: Path, target: str) -> str:
    """Wait for step 2, send SIGINT to `target`, return stderr once the run has exited."""
    try:
        _wait_for_step(out, proc, 2)
        if target == "the_trainer":
            os.kill(proc.pid, signal.SIGINT)
        else:  # every process of the session, as a terminal's Ctrl-C signals its foreground group
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return err


@pytest.mark.parametrize("target", ["the_trainer", "its_process_group"])
def test_ctrl_c_checkpoints_the_step_exits_130_and_the_rerun_resumes_bit_for_bit(shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                                 target):
    out = tmp_path / "run"
    workers = "data.num_workers=2" if target == "its_process_group" else "data.num_workers=0"
    proc = subprocess.Popen([sys.executable, "-m", "trainkit.cli", "run", str(TINY),
                             *_sets(shards_rgb, out, "train.steps=1000", "parallel.fsdp=none", workers)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err = _stop(proc, out, target)
    line = _one_line(err)
    assert proc.returncode == 130 and "stopped by SIGINT (Ctrl-C)" in line, (proc.returncode, err)
    _stopped_then_resumed(capsys, shards_rgb, out, tmp_path, line)  # and the rerun says it resumes


def test_a_fresh_run_prints_no_resume_line(shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}", "train.steps=1",
                        "parallel.fsdp=none")
    assert code == 0 and "resuming from" not in err, err


def test_a_second_ctrl_c_exits_at_once_with_one_line(shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    """The real handler, real signals to this process: the first only asks for a stop, the second
    raises out of whatever is under way; the CLI turns it into one line and 130."""
    import trainkit.train

    seen = {}
    before = signal.getsignal(signal.SIGINT)  # Python's handler, or SIG_IGN under a shell's background job

    def run(cfg, stop):
        os.kill(os.getpid(), signal.SIGINT)
        seen["first"] = stop.signum  # the handler ran at the next bytecode; no exception
        os.kill(os.getpid(), signal.SIGINT)
        seen["after"] = "the second SIGINT did not interrupt"

    monkeypatch.setattr(trainkit.train, "run", run)
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}")
    assert seen == {"first": signal.SIGINT} and code == 130, (seen, code, err)
    assert "interrupted by Ctrl-C" in _one_line(err)
    assert signal.getsignal(signal.SIGINT) == before  # put back on the way out


def test_after_a_ctrl_c_a_sigterm_exits_at_once_and_after_a_sigterm_nothing_does():
    """torchrun passes a second Ctrl-C on to its ranks as SIGTERM; a SIGTERM after a SIGTERM is
    torchrun's to the ranks still finishing, which must not cut their checkpoint short."""
    from trainkit.train import StopSignals

    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # stopped: the way out ignores a later one
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with pytest.raises(KeyboardInterrupt), StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT
        os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.timeout(400)
def test_under_torchrun_ctrl_c_stops_both_ranks_at_one_step_and_a_resume_is_bit_for_bit(shards_rgb, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                             "-m", "trainkit.cli", "run", str(TINY),
                             *_sets(shards_rgb, out, "train.steps=1000", "parallel.fsdp=block", "data.num_workers=0")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err = _stop(proc, out, "its_process_group")  # torchrun's group: the ranks sit in sessions of their own
    said = re.findall(r"trainkit: stopped by SIGINT \(Ctrl-C\)[^\n]*?resume from it", err)
    assert len(said) == 2 and said[0] == said[1], err[-3000:]
    # torchrun prints its own SignalException traceback (its code, not ours); no rank raised
    assert not re.search(r'File "[^"]*/(trainkit|datakit)/', err), err[-3000:]
    last = [x["step"] for x in step_lines(out)][-1]
    final = out / "checkpoints" / f"step-{last + 1:06d}"
    manifest = json.loads((final / "trainkit.json").read_text())
    assert manifest["step"] == last + 1 and manifest["world_size"] == 2 and final.name in said[0]
    assert _checkpoints(out)[-1] == final.name
    # resumed on 2 processes vs an unbroken 2-process run of as many steps
    sets = ("optim.schedule=constant", "parallel.fsdp=block", "output.log_every=1", f"train.steps={last + 3}")
    unbroken, resumed = run_distributed([tiny_config(shards_rgb, tmp_path / "unbroken", *sets),
                                         tiny_config(shards_rgb, out, *sets, "output.checkpoint_every=5")])
    assert "error" not in unbroken and "error" not in resumed, (unbroken, resumed)
    assert resumed["start_step"] == last + 1
    assert [x["loss"] for x in step_lines(out)] == [x["loss"] for x in step_lines(tmp_path / "unbroken")]

"""`trainkit tune` / `trainkit ladder` stopped by a signal (issue 25, defects 11 and 12).

SIGTERM, SIGINT or kill -9 of the parent must leave no trial behind: SIGTERM and SIGINT make the
parent stop the running trial's process group, report what finished (tune.json / best.toml,
ladder.json / ladder.md) in one line and exit 128 + the signal; kill -9 takes the trial with it
(the kernel's parent-death signal). The oracle for "no trial left" is the kernel's own process
table: every process of the trial's session (the trial is its leader: run_trial starts it in a
session of its own) is gone or a zombie. The Ctrl-C report is checked in-process with a fake
runner that sends itself SIGINT while "running" its second trial, so the first is known finished.

Robust on a loaded 2-core machine: every wait polls with a generous limit; every process these
tests start (and each trial found under it) is SIGKILLed by pid at the end if still there.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.trials.run import TrialResult
from trainkit_harness import ROOT, TINY

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                           reason="reads /proc; PR_SET_PDEATHSIG is Linux's")]
SPACE = ["--micro-batches", "2", "--strides", "0", "--groups", "1", "--compile", "off"]
LIMIT_S = 120.0  # for anything to happen on a loaded machine; a pass takes a few seconds


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[3])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid`."""
    return [p for p in _pids() if (st := _stat(p)) is not None and st[2] == sid and st[0] != "Z"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _poll(cond: Callable[[], object], what: str | Callable[[], str], limit_s: float = LIMIT_S) -> object:
    """cond()'s first true value, within limit_s; else an error saying `what` (a callable: as it is then)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {limit_s:g} s: {what() if callable(what) else what}")


def _trial_of(parent: subprocess.Popen) -> int:
    """The pid of the parent's trial child once it runs `python -m trainkit.trials` (exec done)."""
    def find() -> int | None:
        assert parent.poll() is None, f"the parent exited with {parent.returncode} before a trial started"
        return next((p for p in _pids() if (st := _stat(p)) and st[1] == parent.pid
                     and "trainkit.trials" in _cmdline(p)), None)
    return _poll(find, "a trial child appears")


@contextmanager
def _started(cmd: list[str], tmp: Path) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """`cmd` as a subprocess (stdout/stderr into tmp/out.txt, tmp/err.txt); at the end it, and
    every process of the trial sessions recorded in the yielded list, are SIGKILLed if still there."""
    trials: list[int] = []
    with open(tmp / "out.txt", "wb") as out, open(tmp / "err.txt", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT)
    try:
        yield proc, trials
    finally:
        leftovers = [p for sid in trials for p in _session(sid)]
        for pid in [proc.pid, *leftovers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=LIMIT_S)


def _stop_and_check(cmd: list[str], tmp: Path, sig: signal.Signals) -> tuple[int, str]:
    """Start `cmd`, wait for its trial, send `sig` to it; the trial's whole session must be gone
    within LIMIT_S. Returns the parent's exit code and stderr."""
    with _started(cmd, tmp) as (parent, trials):
        trial = _trial_of(parent)
        trials.append(trial)
        _poll(lambda: "libtorch" in _maps(trial), f"trial {trial} has loaded torch")  # well into its start
        os.kill(parent.pid, sig)
        rc = parent.wait(timeout=LIMIT_S)
        _poll(lambda: not _session(trial), lambda: f"every process of trial {trial}'s session ends after "
              f"{sig.name} of its parent (left: {_session(trial)})")
    return rc, (tmp / "err.txt").read_text()


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("trainkit:")]
    assert len(lines) == 1, err
    return lines[0]


def _strict(path: Path) -> dict:
    def refuse(token: str) -> None:
        raise AssertionError(f"{path}: {token} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def _tune_cmd(shards: Path, out: Path) -> list[str]:
    """A tune whose first trial runs until stopped (100,000 steps)."""
    return [sys.executable, "-m", "trainkit.cli", "tune", str(TINY), "--memory-cap", "1", "--budget-min", "30",
            "--out", str(out), "--steps", "100000", *SPACE, "--set", f"data.shards={shards}",
            "--set", "data.num_workers=0"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_a_signal_to_tune_ends_its_running_trial(shards_rgb, tmp_path, sig):  # noqa: F811
    out = tmp_path / "tune"
    rc, err = _stop_and_check(_tune_cmd(shards_rgb, out), tmp_path, sig)
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        return
    assert rc == 128 + sig, err
    line = _one_line(err)
    assert f"stopped by {sig.name}" in line and str(out / "tune.json") in line, line
    doc = _strict(out / "tune.json")
    assert doc["stopped"] == sig.name and doc["runs"] == [] and doc["best"] is None
    assert not (out / "best.toml").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_signal_to_ladder_ends_its_running_rung(shards_rgb, tmp_path, sig):  # noqa: F811
    out = tmp_path / "ladder"
    cmd = [sys.executable, "-m", "trainkit.cli", "ladder", str(TINY), "--rungs", "slot_pruning", "--warmup", "0",
           "--steps", "100000", "--profile-steps", "0", "--out", str(out), "--set", f"data.shards={shards_rgb}",
           "--set", "data.num_workers=0", "--set", "data.prune_slots=false"]
    rc, err = _stop_and_check(cmd, tmp_path, sig)
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        return
    assert rc == 128 + sig, err
    line = _one_line(err)
    assert f"stopped by {sig.name}" in line and str(out / "ladder.json") in line, line
    rungs = _strict(out / "ladder.json")["rungs"]
    assert [(r["name"], r["status"]) for r in rungs] == [("baseline", "stopped")]
    assert "stopped by SIGTERM" in (out / "ladder.md").read_text()


def test_kill_9_of_tune_takes_every_torchrun_rank_along(shards_rgb, tmp_path):  # noqa: F811
    """--nproc 2: the trial is torchrun, whose ranks each start a session of their own (so the
    oracle is the processes themselves): kill -9 of tune kills torchrun (its parent-death signal),
    and each rank dies with torchrun (set again by trainkit/trials/__main__.py)."""
    cmd = [*_tune_cmd(shards_rgb, tmp_path / "tune"), "--nproc", "2"]
    with _started(cmd, tmp_path) as (parent, sessions):
        torchrun = _trial_of(parent)
        sessions.append(torchrun)

        def ranks() -> list[int]:
            found = [p for p in _pids() if (st := _stat(p)) and st[1] == torchrun and "libtorch" in _maps(p)]
            return found if len(found) == 2 else []
        started = _poll(ranks, "torchrun's two ranks load torch")
        sessions.extend(started)
        os.kill(parent.pid, signal.SIGKILL)
        assert parent.wait(timeout=LIMIT_S) == -signal.SIGKILL
        def alive() -> list[int]:
            return [p for p in (torchrun, *started) if (st := _stat(p)) and st[0] != "Z"]

        _poll(lambda: not alive(), lambda: f"torchrun and its ranks end after kill -9 of tune (left: {alive()})")


def test_a_trial_whose_owner_is_gone_before_it_asked_ends_itself():
    """The race PR_SET_PDEATHSIG leaves (the owner dies between fork and prctl): die_with_parent
    checks the owner is still the parent or grandparent, and ends the process if not."""
    code = "from trainkit.trials.signals import die_with_parent; import sys; die_with_parent(int(sys.argv[1])); print('alive')"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that was a process and is no longer anyone's parent

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=LIMIT_S, check=False)

    assert run([sys.executable, "-c", code, str(os.getpid())]).stdout == "alive\n"  # the parent
    assert run(["sh", "-c", f'"{sys.executable}" -c "{code}" {os.getpid()}; true']).stdout == "alive\n"  # grandparent
    assert run([sys.executable, "-c", code, str(gone.pid)]).returncode == -signal.SIGKILL


# --- Ctrl-C after a finished trial, in-process: a fake runner, a real SIGINT ----------------------

def _finished(trial, summary=None, intervals=(), losses=None) -> TrialResult:
    return TrialResult(name=trial.name, status="ok", error=None, returncode=0, pid=0, wall_s=0.1,
                       out_dir=Path(trial.out_dir), summary=summary, intervals=list(intervals), losses=losses or {})


def _ctrl_c(trial) -> TrialResult:
    """The user presses Ctrl-C while this trial runs (SIGINT to the parent); the fake then waits
    as run_trial does, looking for the stop the handler recorded (raise_if_stopped)."""
    from trainkit.trials.signals import raise_if_stopped

    os.kill(os.getpid(), signal.SIGINT)
    _poll(lambda: raise_if_stopped(), "the SIGINT is seen as a stop")
    raise AssertionError("unreachable")


def _call(argv: list[str]) -> int:
    from trainkit.cli import main
    try:
        return main(argv)
    except KeyboardInterrupt:  # never reaches pytest, which would stop the session
        pytest.fail("Ctrl-C escaped `trainkit` as KeyboardInterrupt (a traceback for the user)")


def test_ctrl_c_of_tune_reports_the_finished_runs(monkeypatch, tmp_path, capsys):
    from trainkit.trials import tune

    calls: list[str] = []

    def runner(trial):
        calls.append(trial.name)
        if len(calls) == 1:
            return _finished(trial, summary={"steady": {"samples_per_s_gpu": 12.5, "peak_mem_gib": None}})
        return _ctrl_c(trial)

    monkeypatch.setattr(tune, "run_trial", runner)
    before = signal.getsignal(signal.SIGINT)
    out = tmp_path / "tune"
    code = _call(["tune", str(TINY), "--memory-cap", "1", "--out", str(out), "--micro-batches", "1,2,4",
                  "--strides", "0", "--groups", "1", "--compile", "off", "--set", "data.shards=unused"])
    err = capsys.readouterr().err
    assert code == 130 and len(calls) == 2, err
    line = _one_line(err)
    assert "stopped by SIGINT" in line and "1 run(s) finished" in line, line
    doc = _strict(out / "tune.json")
    assert doc["stopped"] == "SIGINT" and [r["label"] for r in doc["runs"]] == calls[:1]
    assert doc["best"]["samples_per_s"] == 12.5 and (out / "best.toml").exists()
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_ctrl_c_of_ladder_reports_the_finished_rungs(monkeypatch, tmp_path, capsys):
    from trainkit.trials import ladder

    calls: list[str] = []
    interval = {"step": 1, "steps": 2, "step_time_s": 0.5, "samples_per_s_gpu": 8.0, "mfu": None,
                "peak_mem_gib": None, "data_wait_s": 0.0}

    def runner(trial, replace=False):
        calls.append(trial.name)
        if len(calls) == 1:
            return _finished(trial, intervals=[interval], losses={0: 1.0, 1: 0.9})
        return _ctrl_c(trial)

    monkeypatch.setattr(ladder, "run_trial", runner)
    before = signal.getsignal(signal.SIGINT)
    out = tmp_path / "ladder"
    code = _call(["ladder", str(TINY), "--rungs", "slot_pruning,block_fsdp", "--warmup", "0", "--steps", "2",
                  "--profile-steps", "0", "--out", str(out), "--set", "data.shards=unused",
                  "--set", "data.prune_slots=false", "--set", "parallel.fsdp=root"])
    err = capsys.readouterr().err
    assert code == 130 and calls == ["baseline", "slot_pruning"], err
    line = _one_line(err)
    assert "stopped by SIGINT" in line and "1 rung(s) finished" in line, line
    rungs = _strict(out / "ladder.json")["rungs"]
    assert [(r["name"], r["status"]) for r in rungs] == [("baseline", "ok"), ("slot_pruning", "stopped")]
    assert rungs[0]["measured"]["samples_per_s_gpu"] == 8.0
    assert (out / "ladder.md").exists()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_stopped_trial_leaves_no_process_of_its_group():
    """The limit stops the whole group: a process of it that ignores SIGTERM while the leader exits
    is killed too (a timed-out trial's process held 54 GiB of an H100 into the next call). Control:
    SIGTERM alone leaves it running."""
    from trainkit.trials.run import _stop_group

    script = ("import os, signal, sys, time\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "    print(os.getpid(), flush=True)\n"  # once it ignores SIGTERM
              "    time.sleep(60); os._exit(0)\n"
              "time.sleep(60)\n")

    def start():
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        return proc, int(proc.stdout.readline())

    def alive(pid):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    proc, child = start()
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the control: the leader goes, the child stays
        proc.wait(timeout=LIMIT_S)
        time.sleep(0.3)
        assert alive(child)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    proc, child = start()
    _stop_group(proc)
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)

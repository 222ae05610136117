"""How a trial ends with its caller: SIGINT / SIGTERM stop it cleanly, kill -9 takes it along.

    with stop_on_signals():          # trainkit tune / trainkit ladder, around the whole search
        result = run_trial(trial)    # raises Interrupted once a SIGINT or SIGTERM has arrived
    # search() and run_ladder() catch it, keep what finished; the CLI reports it, exits 128 + n

A trial is a process group of its own (run_trial's `start_new_session`: the terminal's Ctrl-C
reaches the caller only, and the limit stops every rank at once), so nothing stops it for free
when the caller goes. Two ways the caller goes:

- SIGINT (Ctrl-C) or SIGTERM: the handler of `stop_on_signals` only records the signal. run_trial
  waits in steps of a fraction of a second and checks the record, so it is run_trial that stops the
  trial's group (SIGTERM, SIGKILL after the grace period) and raises `Interrupted`, and no exception
  ever lands in the middle of other code (between fork and `proc =`, inside a report's write).
  A trial is never started once a stop was asked for.
- kill -9 (or any death that runs no handler): `die_with_parent` asks the kernel for
  PR_SET_PDEATHSIG = SIGKILL. run_trial sets it in the child between fork and exec (the child is
  `python -m trainkit.trials`, or torchrun), and trainkit/trials/__main__.py sets it again first
  thing, for the ranks torchrun starts (each in a session of its own) so that every rank dies with
  torchrun. The same pattern as datakit/convert/engines/engine.py's workers.

Why PR_SET_PDEATHSIG and not a watchdog thread in the child polling os.getppid(): the kernel sends
it at the parent's exit whatever the child is doing, while a thread needs the GIL, which a rank
stuck in a C call (a hung collective, a long compile) can hold for minutes, and polls (a second of
training into --out after the parent is gone). The one gap, a parent that dies between fork and
prctl, is closed by checking afterwards that the owner (TRIAL_OWNER_ENV: the tune or ladder
process) is still the parent, or under torchrun the grandparent. PR_SET_PDEATHSIG fires when the
*thread* that started the child ends: run_trial waits for its child in that thread, so it outlives it.
Linux only; elsewhere `die_with_parent` does nothing.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h
TRIAL_OWNER_ENV = "TRAINKIT_TRIAL_OWNER"  # the pid of the process that started the trial
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested: list[int] = []  # the first stop signal received under stop_on_signals, if any


class Interrupted(BaseException):
    """A SIGINT or SIGTERM asked `trainkit tune` / `ladder` to stop; run_trial has stopped the running
    trial. A BaseException, as KeyboardInterrupt, so no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by the signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM are recorded for run_trial to act on (module docstring); the handlers in
    place before are put back on the way out. Outside the main thread (where Python runs signal
    handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    before = {s: signal.signal(s, _record) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        _requested.clear()  # a later run_trial of this process starts afresh


def _record(signum: int, frame: object) -> None:
    if not _requested:  # the first one counts; a second Ctrl-C does not cut the clean-up short
        _requested.append(signum)


def stop_requested() -> Interrupted | None:
    """The stop asked for under stop_on_signals (None: none)."""
    return Interrupted(_requested[0]) if _requested else None


def raise_if_stopped() -> None:
    """Interrupted if a stop was asked for: run_trial's check before it starts and while it waits."""
    stop = stop_requested()
    if stop is not None:
        raise stop


def parent_death_hook(owner: int | None) -> Callable[[], None]:
    """`die_with_parent(owner)` as a subprocess `preexec_fn`. libc is looked up here, in the parent:
    the hook runs between fork and exec, where loading a library could deadlock on a lock another
    thread of the parent held at the fork."""
    prctl = _libc_prctl()

    def hook() -> None:
        if prctl is None or prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
        if owner is not None and os.getppid() != owner and owner not in _ancestors(2):
            os.kill(os.getpid(), signal.SIGKILL)  # the owner died before prctl: nobody reads this trial

    return hook


def die_with_parent(owner: int | None) -> None:
    """SIGKILL this process when its parent dies (kill -9 included), and now if `owner` is no longer
    its parent or grandparent (it died first)."""
    parent_death_hook(owner)()


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


def _ancestors(depth: int) -> list[int]:
    """This process's parent, its parent's parent, ... (`depth` of them, fewer where /proc ends)."""
    found = [os.getppid()]
    while len(found) < depth:
        try:
            stat = Path(f"/proc/{found[-1]}/stat").read_text()
        except OSError:
            break
        found.append(int(stat.rsplit(")", 1)[1].split()[1]))  # the name in (...) may hold spaces
    return found

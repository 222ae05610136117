"""One training run as its own process, under a time limit: its summary, or its error as a record.

    from trainkit.trials.run import Trial, run_trial
    r = run_trial(Trial(config="trainkit/configs/pi05_tiny.toml", out_dir="runs/t0",
                        overlay={"train.micro_batch": 8, "parallel.group": {"vision_blocks": 4}},
                        overrides=("data.shards=demo-out/shards",), nproc=1, timeout_s=600))
    r.status          # "ok" | "oom" | "compile_error" | "refused" | "crash" | "timeout"
    r.metric("steady.samples_per_s_gpu"), r.losses[3], r.error.message if r.error else None

Why a process per run: a run that runs out of memory, fails to compile, segfaults in a kernel or
hangs in a collective must cost that run only, never the caller (`trainkit ladder`, `trainkit
tune`), and each run must start from a fresh CUDA context and allocator so its peak memory and step
time are its own. The child is `python -m trainkit.trials CONFIG --set ...` (under
`torchrun --standalone --nproc-per-node N` for N > 1): `trainkit run` plus one thing, every rank
that raises writes `trial-error-rank{R}.json` into output.dir (kind, exception type, one-line
message), so the parent reads a typed record and never parses a traceback. A run the limit stops
is killed with its whole process group (SIGTERM, then SIGKILL); one killed by a signal with no
record (the kernel's OOM killer, a segfault) is a "crash" naming the signal. A trial never outlives
its caller: a SIGINT / SIGTERM under `stop_on_signals` stops it and raises `Interrupted`, and
kill -9 of the caller takes it along (trainkit/trials/signals.py).

What a finished trial gives back is what the run wrote into its output.dir: summary.json
(trainkit/observe/summary.py), the step losses, metric intervals and validation records of metrics.jsonl,
and profile_rank0.json when `output.profile_steps` was set. The child's stdout and stderr are in
`output.dir/trial.log`.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from datakit.toml_values import toml_value
from trainkit.errors import USER_ERRORS, LaunchError
from trainkit.trials.signals import TRIAL_OWNER_ENV, parent_death_hook, raise_if_stopped

Status = Literal["ok", "oom", "compile_error", "refused", "crash", "timeout"]
ERROR_FILE = "trial-error-rank{rank}.json"
LOG_FILE = "trial.log"
KILL_GRACE_S = 10.0  # between SIGTERM and SIGKILL when the limit is reached
POLL_S = 0.2  # how often the wait for a trial looks for a requested stop (signals.stop_on_signals)
WEEK_S = 7 * 24 * 3600.0  # the longest time limit a flag takes: longer is a typo, and inf never ends


class TrialSetupError(Exception):
    """The trial cannot be started (its output folder is in use); one line naming the folder."""


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One run to make: a config file, changes on top of it, where it writes, how long it may take."""

    config: str | Path  # a trainkit TOML file
    out_dir: str | Path  # the run's output.dir (set for the run; must be new or empty, see run_trial)
    overrides: tuple[str, ...] = ()  # `--set key=value` texts, applied first
    overlay: Mapping[str, Any] = field(default_factory=dict)  # dotted key -> Python value, applied after
    nproc: int = 1  # processes on this machine; > 1 runs under torchrun --standalone
    timeout_s: float = 900.0  # wall-clock limit of the whole process, start-up included
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the child
    name: str = ""  # the caller's label, carried into the result

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s <= WEEK_S:  # nan fails it too: a limit that never ends
            raise ValueError(f"Trial.timeout_s must be in (0, {WEEK_S:g}] seconds, got {self.timeout_s}")

    def sets(self) -> list[str]:
        """Every `--set` of the child, in order: no final checkpoint (a trial measures; at Pi0.5 `full`
        one is ~39 GB of fp32 weights and Adam moments, 52 with the EMA), which the overrides may
        turn back on, the overrides, the overlay, then this trial's output."""
        return ["output.save_last=false", *self.overrides, *(f"{k}={toml_value(v)}" for k, v in self.overlay.items()),
                f"output.dir={Path(self.out_dir)}", "output.progress=false"]


@dataclass(frozen=True)
class TrialError:
    """What made a trial fail, as the failing rank recorded it (or the parent saw it)."""

    kind: Status  # never "ok"
    type: str  # exception class name ("OutOfMemoryError"), or "Timeout" / "Signal" / "Exit"
    message: str  # one line
    rank: int | None = None  # the rank that recorded it; None when seen by the parent


@dataclass
class TrialResult:
    """The outcome of one trial. Everything but `status`, `error` and `wall_s` is read from output.dir."""

    name: str
    status: Status
    error: TrialError | None
    returncode: int | None  # None: stopped at the limit
    pid: int  # the child's pid, also its process group's id
    wall_s: float  # the child process's wall time, start-up included
    out_dir: Path
    summary: dict[str, Any] | None = None  # summary.json, when the run got that far
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (metrics.jsonl "step" lines)
    intervals: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl "interval" lines
    evals: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl "eval" lines (validation)
    profile: dict[str, Any] | None = None  # profile_rank0.json (output.profile_steps > 0)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def log(self) -> Path:
        return self.out_dir / LOG_FILE

    def metric(self, dotted: str) -> Any:
        """A summary.json value by dotted key ("steady.samples_per_s_gpu"); None if absent."""
        node: Any = self.summary
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for reports (losses keyed by step as text)."""
        return {"name": self.name, "status": self.status, "error": None if self.error is None else vars(self.error),
                "returncode": self.returncode, "wall_s": self.wall_s, "out_dir": str(self.out_dir),
                "summary": self.summary, "losses": {str(k): v for k, v in sorted(self.losses.items())},
                "evals": self.evals, "profile": _profile_numbers(self.profile)}


def command(trial: Trial) -> list[str]:
    """The child's command line."""
    if trial.nproc < 1:
        raise ValueError(f"Trial.nproc must be >= 1, got {trial.nproc}")
    launch = [sys.executable, "-m", "trainkit.trials"]
    if trial.nproc > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                  str(trial.nproc), "-m", "trainkit.trials"]
    return [*launch, str(trial.config), *[a for s in trial.sets() for a in ("--set", s)]]


def run_trial(trial: Trial, *, replace: bool = False) -> TrialResult:
    """Run `trial` in its own process (group) and wait for it, at most `trial.timeout_s`.

    output.dir must not exist or be empty, so nothing resumes from or mixes with an older run;
    `replace=True` deletes it first (for a caller that owns the folder). Under `stop_on_signals`, a
    SIGINT / SIGTERM stops the trial's group and raises `Interrupted` (before it starts: at once)."""
    raise_if_stopped()
    out = Path(trial.out_dir)
    if replace and out.exists():
        shutil.rmtree(out)
    if out.exists() and any(out.iterdir()):
        raise TrialSetupError(f"{out}: trial output folder exists and is not empty; remove it or use another")
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **trial.env, "PYTHONUNBUFFERED": "1", TRIAL_OWNER_ENV: str(os.getpid())}
    t0 = time.perf_counter()
    with open(out / LOG_FILE, "wb") as log:
        # its own group: the limit stops every rank; and it dies with this process (kill -9 included)
        proc = subprocess.Popen(command(trial), stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True,
                                preexec_fn=parent_death_hook(os.getpid()))  # noqa: PLW1509 - no lock taken in it
        try:
            rc: int | None = _wait(proc, trial.timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            rc = None
        except BaseException:  # a stop asked for (Interrupted), or any other: no rank is left running
            _stop_group(proc)
            raise
    wall = time.perf_counter() - t0
    error = _error(out, rc, trial.timeout_s)
    result = TrialResult(name=trial.name, status="ok" if error is None else error.kind, error=error, returncode=rc,
                         pid=proc.pid, wall_s=wall, out_dir=out)
    _read_outputs(result)
    return result


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """proc's exit code, waiting at most `timeout_s` (TimeoutExpired after), in steps of POLL_S so
    a stop asked for by a signal is acted on within one (Interrupted)."""
    deadline = time.monotonic() + timeout_s
    while True:
        raise_if_stopped()
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            return proc.wait(timeout=min(POLL_S, left))
        except subprocess.TimeoutExpired:
            continue


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it after KILL_GRACE_S; then SIGKILL whatever of the
    group outlived its leader (a process that waited out the SIGTERM while the leader exited): on
    the 2026-12-07 H100 lease a timed-out trial's process kept 54 GiB of the card into the next call."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is empty (or only zombies left it)
            return
        time.sleep(0.05)


def _error(out: Path, rc: int | None, timeout_s: float) -> TrialError | None:
    """The trial's error: a rank's record first (rank 0's if several), else what the exit says."""
    records = sorted(out.glob(ERROR_FILE.format(rank="*")))
    if records:
        firsts = [json.loads(p.read_text()) for p in records]
        first = min(firsts, key=lambda r: r["rank"])
        return TrialError(kind=first["kind"], type=first["type"], message=first["message"], rank=first["rank"])
    if rc is None:
        return TrialError(kind="timeout", type="Timeout", message=f"stopped at the time limit of {timeout_s:g} s")
    if rc == 0:
        return None
    if rc < 0 or rc > 128:  # killed by a signal (torchrun reports 128 + n for its children)
        sig = -rc if rc < 0 else rc - 128
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = " (the kernel's OOM killer sends it when host memory runs out)" if name == "SIGKILL" else ""
        return TrialError(kind="crash", type="Signal", message=f"killed by {name}{why}; see {out / LOG_FILE}")
    return TrialError(kind="crash", type="Exit", message=f"exited with code {rc} and no error record; "
                      f"last line: {_last_line(out / LOG_FILE)}")


def check_flag(flag: str, value: float, *, high: float = math.inf, zero: bool = False) -> None:
    """A number flag of tune / ladder: finite, > 0 (>= 0 with `zero`) and <= `high`; LaunchError
    naming the flag otherwise (nan fails every comparison, so it is refused with the rest)."""
    low_ok = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= high):
        bound = f" and <= {high:g}" if math.isfinite(high) else ""
        raise LaunchError(f"{flag}: must be a finite number {'>=' if zero else '>'} 0{bound}, got {value:g}")


def json_text(doc: Any) -> str:
    """`doc` as strict JSON (RFC 8259 has no NaN or Infinity; Python's json writes them as tokens
    that most readers refuse): a non-finite float becomes null, "no finite value". Written, not
    refused, because a report of runs that diverged must still be written and read."""
    return json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n"


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def _read_outputs(result: TrialResult) -> None:
    out = result.out_dir
    try:
        result.summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        result.summary = None
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    for text in lines:
        try:
            rec = json.loads(text)
        except ValueError:  # a line cut by a kill
            continue
        kind = rec.get("kind")
        if kind == "step":
            result.losses[int(rec["step"])] = rec["loss"]
        elif kind == "interval":
            result.intervals.append(rec)
        elif kind == "eval":
            result.evals.append(rec)
    try:
        result.profile = json.loads((out / "profile_rank0.json").read_text())
    except (OSError, ValueError):
        result.profile = None


def _profile_numbers(profile: dict[str, Any] | None) -> dict[str, Any] | None:
    """The profile's per-step numbers, without its kernel and GEMM tables (kept in the run folder)."""
    if profile is None:
        return None
    return {k: v for k, v in profile.items() if not isinstance(v, list)}


def error_kind(e: BaseException) -> Status:
    """How a run failed, from its exception (and the exceptions it was raised from)."""
    import torch

    chain, seen = [], e
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(x, torch.OutOfMemoryError) or "out of memory" in str(x).lower() for x in chain):
        return "oom"
    if any(c.__module__.startswith(("torch._dynamo", "torch._inductor")) for x in chain for c in type(x).__mro__):
        return "compile_error"
    if isinstance(e, USER_ERRORS):
        return "refused"
    return "crash"

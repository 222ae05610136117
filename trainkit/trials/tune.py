"""`trainkit tune CONFIG.toml --memory-cap GiB [--budget-min M]`: the fastest settings under a
memory cap, by short measured runs, each in its own process (trainkit/trials/run.py).

1. Space: micro-batch x recompute stride per block list x FSDP grouping per block list (with
   fsdp = "block") x compile on/off x CUDA graphs on/off (on a CUDA machine; parallel/cudagraphs.py
   captures the micro-step under any fsdp mode). About 4,600 settings for pi05.
2. Every setting gets inspect's memory estimate (trainkit/estimate/inputs.py, on the inputs of one meta-device
   build) and a predicted throughput (`candidates`). A setting whose estimate is above the cap is
   never run, nor one that only adds recompute to a setting that fits (`undominated`).
3. The first run calibrates the estimate: the config's own setting, at the largest micro-batch up
   to its own that the estimate fits under the cap (`reference`: what the hand-written config
   does under this cap, the search's yardstick; without one, the best-predicted setting). Its
   measured peak over the estimate's micro-batch part (`memory.dynamic_gib`) scales that part for
   every later setting. Then the rest run best-first by predicted speed while the budget allows
   (below).
   Each run's peak can only raise the scale (the largest ratio seen wins, so a cap is not crossed
   by trusting a low one); an out-of-memory run raises it until that setting is estimated at the
   GPU's memory, which prunes it and everything needing more. Compile errors, crashes and
   time-outs are recorded; the search goes on. A SIGINT / SIGTERM (trainkit/trials/signals.py)
   stops the running trial and ends the search with the runs that finished.
4. Repeats: one short run's speed is noise on a busy machine (two runs of identical losses took 33
   and 455 ms a step on a loaded host), so the `top` settings (default 3) by their first run are
   run again, in rounds in the order they first ran (A B C A B C, never A A B B: a slow spell of
   the machine then costs every setting alike), until each has `repeats` runs (default 2). A
   setting's speed is the median of its runs, its spread their min-max; a setting whose slowest run
   is no faster than the next setting's fastest is a tie with it (`Measured.tie`): the order of the
   two is not established. A setting any of whose runs failed or went over the cap is not best.
5. Output under --out (trainkit/trials/tune_report.py): tune.json (every run in the order run,
   repeats included, each setting's runs together, the counts pruned, the scale), best.toml (an
   overlay for `trainkit run CONFIG --overlay best.toml`, its median samples/s, spread and peak
   beside it), one folder per run; the ranked table on the terminal.

The budget (`budget_s`, wall clock, start-ups and compiles included) is split so that repeats
are paid for, not hoped for: a new setting is started only while the time left covers its run (the
mean wall time of the runs of its kind so far, compiled or eager, `expected_wall`) plus the repeats
the current top settings need ((repeats - 1) x their first runs' wall times); a setting that cannot
finish is skipped, and the table and tune.json say so ("late"), while shorter ones still run; then
the repeats run. A repeat is started only when its first
run's wall time fits the time left, so a budget that ends early leaves a setting with fewer runs
(the table's `runs` column) rather than a run killed half-way. Every run's time limit is also the
time left: one stopped by that limit, not by --trial-timeout-s, is recorded as "cut" and counts
for nothing. With runs of a minute, a 10-minute budget buys about 6 settings, 3 of them run twice.

Why a sorted sweep and not Optuna: a 10-minute budget buys 5-8 runs of a full preset (each
compiles and warms up for most of its minute). A sampler learns nothing in that many trials
(Optuna's TPE starts with 10 random ones), while the memory model and the FLOP count already
order the space, so measuring the best-predicted settings first is the whole search. Measured runs
of the same micro-batch and recompute that differ only in grouping are taken after every other
distinct one (grouping moves speed by <= 2%, bench/results/pi05_h200.md).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainkit.config import RunConfig
from trainkit.errors import LaunchError
from trainkit.estimate.inputs import estimate_setting, memory_inputs
from trainkit.estimate.inspect import gpu_memory
from trainkit.estimate.memory import dynamic_gib, recompute_map
from trainkit.trials.run import Trial, TrialResult, run_trial
from trainkit.trials.signals import Interrupted

MICRO_BATCHES = (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64, 80, 96, 128)
STRIDES = (0, 1, 2, 4)  # recompute every n-th block (0: none)
GROUPS = (1, 2, 4)  # blocks per FSDP unit
# Predicted speed, relative (only the order matters). Measured on pi05 full, 2 H200s
# (bench/results/pi05_h200.md): a step costs about 6 samples' worth of fixed time (661 ms at
# micro-batch 32, 800 at 40: 17.4 ms per sample + 105 ms), compile is 1.16x eager (49.93 vs
# 43.15 samples/s), and recomputing every block made a step 1.227x longer (49.93 vs 40.69).
STEP_OVERHEAD_SAMPLES = 6.0
COMPILE_GAIN = 1.16
RECOMPUTE_COST = 0.227  # added time per recomputed block, as a fraction of its share of the step
TOP = 3  # settings run again, by their first run's speed
REPEATS = 2  # runs of each of them, the first included


@dataclass(frozen=True)
class Setting:
    """One point of the space."""

    micro_batch: int
    ac_stride: tuple[tuple[str, int], ...]  # (block list, stride) in BLOCK_LISTS order
    group: tuple[tuple[str, int], ...]  # () unless fsdp = "block"
    compile: bool
    cuda_graphs: bool = False

    def overlay(self) -> dict[str, Any]:
        """Dotted config keys -> values: what a trial sets and best.toml holds."""
        out: dict[str, Any] = {"train.micro_batch": self.micro_batch, "parallel.ac_stride": dict(self.ac_stride)}
        if self.group:
            out["parallel.group"] = dict(self.group)
        return {**out, "parallel.compile": self.compile, "parallel.cuda_graphs": self.cuda_graphs}

    def label(self) -> str:
        parts = [f"mbs {self.micro_batch}", "ac " + " ".join(f"{k}={v}" for k, v in self.ac_stride)]
        if self.group:
            parts.append("group " + " ".join(f"{k}={v}" for k, v in self.group))
        parts.append(("compile" if self.compile else "eager") + (" + graphs" if self.cuda_graphs else ""))
        return ", ".join(parts)


@dataclass
class Candidate:
    """A setting with what the models say of it (estimate parts from memory.estimate, GiB)."""

    setting: Setting
    static_gib: float  # does not scale with the micro-batch
    dynamic_gib: float  # does; the measured runs correct it
    speed: float  # predicted, relative
    units: int  # FSDP units (fewer: fewer collectives, a tie-break)

    def peak(self, scale: float) -> float:
        return self.static_gib + scale * self.dynamic_gib

    def fits(self, scale: float, cap_gib: float) -> bool:
        """Its estimate at `scale` is under the cap, float rounding aside: the scale calibrated on a run
        measured exactly at the cap gives that run's setting back at the cap to the last bit or two."""
        return self.peak(scale) <= cap_gib * (1 + 1e-9)


@dataclass
class Run:
    """A measured run, as tune.json lists it."""

    setting: Setting
    status: str  # "ok", "over_cap" (ran, peak above the cap), or the trial's failure status
    estimate_gib: float  # the calibrated estimate when it was started
    inspect_gib: float  # `trainkit inspect`'s estimate (uncalibrated): beside the peak, for memory.md
    predicted: float
    samples_per_s: float | None = None
    peak_gib: float | None = None
    wall_s: float = 0.0
    error: str | None = None
    out_dir: str = ""
    repeat: int = 0  # 0: the setting's first run; 1, 2, ...: its repeats

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {**d, "setting": self.setting.overlay(), "label": self.setting.label()}

    @property
    def speed(self) -> float | None:
        """Its samples/s when it measured one (ok and finite), else None."""
        v = self.samples_per_s
        return v if self.status == "ok" and v is not None and math.isfinite(v) else None


STATUS_ORDER = {"ok": 0, "over_cap": 1}  # then every failure


@dataclass
class Measured:
    """One setting over all its runs: what the table ranks and best.toml holds. Its status is "ok"
    only when every run that counts is ("cut" runs, stopped by the budget, do not count)."""

    setting: Setting
    runs: list[Run]
    tie: bool = False  # its slowest run is no faster than the next setting's fastest (ranked order)
    rank: int = 0  # 1 = fastest

    @property
    def counted(self) -> list[Run]:
        return [r for r in self.runs if r.status != "cut"] or self.runs

    @property
    def status(self) -> str:
        return next((r.status for r in self.counted if r.status != "ok"), "ok")

    @property
    def samples(self) -> list[float]:
        return [r.speed for r in self.runs if r.speed is not None]

    @property
    def samples_per_s(self) -> float | None:
        """The median of its runs' samples/s (None: none measured one)."""
        return statistics.median(self.samples) if self.samples else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.samples), max(self.samples)) if self.samples else None

    @property
    def peak_gib(self) -> float | None:
        peaks = [r.peak_gib for r in self.runs if r.peak_gib is not None and math.isfinite(r.peak_gib)]
        return max(peaks, default=None)

    @property
    def error(self) -> str | None:
        return next((r.error for r in self.counted if r.error), None)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "setting": self.setting.overlay(), "label": self.setting.label(),
                "status": self.status, "samples_per_s": self.samples_per_s, "samples": self.samples,
                "spread": None if self.spread is None else list(self.spread), "runs": len(self.runs),
                "tie_with_next": self.tie, "peak_gib": self.peak_gib, "estimate_gib": self.runs[0].estimate_gib,
                "error": self.error, "out_dirs": [r.out_dir for r in self.runs]}


def measured(runs: list[Run]) -> list[Measured]:
    """Each setting's runs together, ranked: measured settings fastest first (by median), then
    those over the cap, then failures in run order; a measured setting whose spread reaches the
    next measured one's is marked a tie."""
    by: dict[Setting, Measured] = {}
    for r in runs:
        by.setdefault(r.setting, Measured(setting=r.setting, runs=[])).runs.append(r)
    ranked = sorted(by.values(), key=lambda m: (STATUS_ORDER.get(m.status, 2),
                                                -(m.samples_per_s if m.status == "ok" and m.samples else 0.0)))
    ok = [m for m in ranked if m.status == "ok" and m.samples]
    for a, b in itertools.pairwise(ok):
        a.tie = a.spread[0] <= b.spread[1]
    for i, m in enumerate(ranked, 1):
        m.rank = i
    return ranked


@dataclass
class Space:
    """The values tried per dimension (the config's own are always added)."""

    micro_batches: tuple[int, ...] = MICRO_BATCHES
    strides: tuple[int, ...] = STRIDES
    groups: tuple[int, ...] = GROUPS
    compile: tuple[bool, ...] = (False, True)


@dataclass
class TuneResult:
    runs: list[Run]  # in the order run, repeats included
    scale: float  # the micro-batch part's correction after the last run (1.0: no peak measured)
    calibrated: bool  # a run measured its peak (not on CPU)
    settings: int  # in the space
    never_run_over_cap: int  # settings never run because their estimate was above the cap
    best: Measured | None  # the fastest setting (median) whose runs all finished under the cap
    reference: Setting | None = None  # the config's own setting under the cap, run first
    stopped: str | None = None  # the signal that stopped the search ("SIGINT"); runs holds what finished
    ranked: list[Measured] = field(default_factory=list)  # `measured(runs)`
    late: list[str] = field(default_factory=list)  # settings not started: they could not finish in the time left


def candidates(cfg: RunConfig, space: Space, world_size: int) -> list[Candidate]:
    """Every setting of the space with its memory estimate and predicted speed."""
    par = cfg.parallel
    inp = memory_inputs(cfg, world_size)  # the model built once: every setting's estimate is inspect's
    model, blocks, mode = inp.model, inp.blocks, inp.mode
    lists = list(model.BLOCK_LISTS)
    # a block list's share of the step, by its share of the block parameters (pi05: vision 15%, LM
    # 85%; by FLOPs 11% / 89%): close enough to order settings, and the same for any family
    share = {n: sum(blocks[n]) / max(1, sum(sum(v) for v in blocks.values())) for n in lists}

    own = {cfg.train.micro_batch} if isinstance(cfg.train.micro_batch, int) else set()  # not "auto"
    micro = sorted(set(space.micro_batches) | own)
    if cfg.train.global_batch:  # the optimiser's batch stays; micro-batches must divide it
        micro = [b for b in micro if cfg.train.global_batch % (b * world_size) == 0]
    stride_sets = itertools.product(*[sorted(set(space.strides) | {par.ac_stride.get(n, 0)}) for n in lists])
    strides = [tuple(zip(lists, s)) for s in stride_sets]
    groups = [()] if par.fsdp != "block" else [
        tuple(zip(lists, g)) for g in itertools.product(*[sorted(set(space.groups) | {par.group.get(n, 1)})
                                                          for n in lists])]
    # CUDA graphs of the micro-step work under any fsdp mode (parallel/cudagraphs.py); refused without CUDA
    graphs = [False, True] if torch.cuda.is_available() else [False]
    out = []
    for b, s, g, c, cg in itertools.product(micro, strides, groups, space.compile, graphs):
        if cg and not c:  # graphs compile the blocks anyway: the same run as compile + graphs
            continue
        setting = Setting(micro_batch=b, ac_stride=s, group=g, compile=c, cuda_graphs=cg)
        accum = max(1, (cfg.train.global_batch or b * world_size) // (b * world_size))
        parts = estimate_setting(inp, micro=b, world=world_size, accum=accum, group=dict(g), stride=dict(s),
                                 compiled=c, graphs=cg)
        recompute = recompute_map(blocks, dict(s))
        rerun = RECOMPUTE_COST * sum(share[n] * len(recompute[n]) / max(1, len(blocks[n])) for n in lists)
        speed = b / (b + STEP_OVERHEAD_SAMPLES) / (1 + rerun) * (COMPILE_GAIN if c else 1.0)
        dyn = dynamic_gib(parts)
        out.append(Candidate(setting=setting, static_gib=parts["peak_gib"] - dyn, dynamic_gib=dyn, speed=speed,
                             units=len(inp.unit_sizes(dict(g))[0]) + (mode != "none")))
    return out


def _core(s: Setting) -> tuple:
    """What distinguishes runs beyond grouping."""
    return s.micro_batch, s.ac_stride, s.compile, s.cuda_graphs


def _but_recompute(s: Setting) -> tuple:
    """What is left of a setting without its recompute strides."""
    return s.micro_batch, s.group, s.compile, s.cuda_graphs


def undominated(fits: list[Candidate]) -> list[Candidate]:
    """Per setting-but-recompute, only the least recompute that fits (the fastest predicted): more
    recompute at the same micro-batch only costs time."""
    best: dict[tuple, Candidate] = {}
    for c in fits:
        key = _but_recompute(c.setting)
        if key not in best or c.speed > best[key].speed:
            best[key] = c
    return list(best.values())


def reference(pool: list[Candidate], base: Setting, cap_gib: float) -> Candidate | None:
    """The config's own setting under the cap: its micro-batch, or the largest below it whose
    (uncalibrated) estimate fits; None if none does."""
    same = [c for c in pool if dataclasses.replace(c.setting, micro_batch=base.micro_batch) == base
            and c.setting.micro_batch <= base.micro_batch and c.peak(1.0) <= cap_gib]
    return max(same, key=lambda c: c.setting.micro_batch, default=None)


def search(cfg: RunConfig, config_path: str | Path, *, cap_gib: float, budget_s: float, out: Path,
           overrides: tuple[str, ...] = (), world_size: int = 1, steps: int = 12, log_every: int = 3,
           trial_timeout_s: float = 300.0, space: Space | None = None, gpu_gib: float | None = None,
           base: Setting | None = None, runner: Callable[[Trial], TrialResult] | None = None,
           top: int = TOP, repeats: int = REPEATS) -> TuneResult:
    """Run the search (module docstring): new settings best-first, then the `top` ones again until
    each has `repeats` runs; with `base` (the config's own setting) the first run is
    `reference(...)`, so the table compares the search with the hand-written config under the same
    cap; `runner` runs one trial (default run_trial; tests pass their own)."""
    pool = candidates(cfg, space or Space(), world_size)
    first = None if base is None else reference(pool, base, cap_gib)
    trials = _Trials(runner=runner or run_trial, config=config_path, out=out, cap_gib=cap_gib,
                     gpu_gib=gpu_gib or gpu_memory()[1], deadline=time.monotonic() + budget_s,
                     trial_timeout_s=trial_timeout_s, world_size=world_size,
                     sets=(*overrides, f"train.steps={steps}", f"output.log_every={log_every}", "output.resume=false",
                           "output.checkpoint_every=0", "output.profile_steps=0"))
    stopped: str | None = None
    try:
        by_setting = {c.setting: c for c in pool}
        _explore(trials, by_setting, first, top, repeats)
        _repeat(trials, by_setting, top, repeats)
    except Interrupted as stop:  # SIGINT / SIGTERM: the trial is stopped; report the runs that finished
        stopped = stop.name
    runs = trials.runs
    ran = {r.setting for r in runs}
    never = sum(1 for c in pool if c.setting not in ran and not c.fits(trials.scale(), cap_gib))
    ranked = measured(runs)
    best = next((m for m in ranked if m.status == "ok" and m.samples), None)
    return TuneResult(runs=runs, scale=trials.scale(), calibrated=bool(trials.ratios), settings=len(pool),
                      never_run_over_cap=never, best=best, reference=None if first is None else first.setting,
                      stopped=stopped, ranked=ranked, late=trials.late)


@dataclass
class _Trials:
    """What one search has measured and how it runs the next trial: the runs, the memory model's
    calibration (every run's peak feeds it), the clock."""

    runner: Callable[[Trial], TrialResult]
    config: str | Path
    out: Path
    cap_gib: float
    gpu_gib: float
    deadline: float  # time.monotonic() at which the budget ends
    trial_timeout_s: float
    world_size: int
    sets: tuple[str, ...]  # every trial's --set before its setting's overlay
    runs: list[Run] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # measured micro-batch part / estimated, per peak
    floor: float = 0.0  # what out-of-memory runs say the scale is at least
    late: list[str] = field(default_factory=list)  # what was not started for lack of time, one line each

    def note_late(self, late: list[Candidate], room: float, repeat: bool = False) -> None:
        """Say which settings were not started because they could not finish in `room` seconds."""
        kinds: dict[bool, list[Candidate]] = {}
        for c in late:
            kinds.setdefault(c.setting.compile, []).append(c)
        for compiled, cs in kinds.items():
            need = expected_wall(self.runs, cs[0].setting)
            what = f"a repeat of {cs[0].setting.label()}" if repeat else \
                f"{len(cs)} {'compiled' if compiled else 'eager'} setting(s)"
            self.late.append(f"{what} not started: each needs ~{need:.0f} s (its kind's runs so far), "
                             f"{max(room, 0.0):.0f} s of the budget left")

    def scale(self) -> float:
        return max(max(self.ratios, default=1.0), self.floor)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def measure(self, pick: Candidate, repeat: int = 0) -> Run:
        """Run `pick` once (raises Interrupted on a stop), record it and calibrate on its peak."""
        limit = max(1.0, min(self.trial_timeout_s, self.left()))
        trial = Trial(config=self.config, out_dir=self.out / "runs" / f"{len(self.runs):02d}",
                      name=pick.setting.label(), overrides=self.sets, overlay=pick.setting.overlay(),
                      nproc=self.world_size, timeout_s=limit)
        run = Run(setting=pick.setting, status="", estimate_gib=round(pick.peak(self.scale()), 6),
                  inspect_gib=round(pick.peak(1.0), 6), predicted=round(pick.speed, 4), out_dir=str(trial.out_dir),
                  repeat=repeat)
        result = self.runner(trial)
        run.wall_s, run.status = round(result.wall_s, 1), result.status
        run.error = None if result.error is None else f"{result.error.type}: {result.error.message}"
        if result.status == "timeout" and limit < self.trial_timeout_s:  # the budget's end, not the run's fault
            run.status, run.error = "cut", f"the budget ended during the run ({limit:.0f} s left)"
        # a ratio below 1/4 would mean a peak under the weights and states: not a measurement to trust
        if result.ok:
            run.samples_per_s, run.peak_gib = result.metric("steady.samples_per_s_gpu"), result.metric("steady.peak_mem_gib")
            if run.peak_gib is not None:  # off CUDA no peak: the estimate stays uncalibrated
                self.ratios.append(max(0.25, (run.peak_gib - pick.static_gib) / max(pick.dynamic_gib, 1e-12)))
                if run.peak_gib > self.cap_gib:
                    run.status = "over_cap"
        elif result.status == "oom":  # it needed more than the GPU has: estimate it there at least
            self.floor = max(self.floor, (self.gpu_gib - pick.static_gib) / max(pick.dynamic_gib, 1e-12))
        self.runs.append(run)
        return run


def _to_repeat(trials: _Trials, by_setting: dict[Setting, Candidate], top: int) -> list[Run]:
    """The first runs of the `top` fastest settings by that first run, in the order they ran; only
    settings still estimated under the cap (an out-of-memory run since may have raised the scale):
    no run, repeat or not, starts above it."""
    fit = {s for s, c in by_setting.items() if c.fits(trials.scale(), trials.cap_gib)}
    firsts = [(i, r) for i, r in enumerate(trials.runs) if r.repeat == 0 and r.speed is not None and r.setting in fit]
    fastest = sorted(firsts, key=lambda ir: -ir[1].speed)[:top]
    return [r for _, r in sorted(fastest, key=lambda ir: ir[0])]


def _explore(trials: _Trials, by_setting: dict[Setting, Candidate], first: Candidate | None, top: int,
             repeats: int) -> None:
    """New settings, best-predicted first (the reference first of all), while the time left covers
    one more run and the repeats the current top settings will need."""
    seen: dict[tuple, int] = {}  # runs per core (settings equal up to grouping)
    pending = list(by_setting.values())
    while pending:
        reserve = (repeats - 1) * sum(r.wall_s for r in _to_repeat(trials, by_setting, top))
        room = trials.left() - reserve
        late = [c for c in pending if expected_wall(trials.runs, c.setting) >= room - 1]
        if late:  # cannot finish in the time left: not started (a run cut by the budget counts for nothing)
            trials.note_late(late, room)
            pending = [c for c in pending if c not in late]
        fits = undominated([c for c in pending if c.fits(trials.scale(), trials.cap_gib)])
        if not fits:
            break
        pick = first if first is not None and not trials.runs else \
            min(fits, key=lambda c: (seen.get(_core(c.setting), 0), -c.speed, c.units, c.peak(trials.scale())))
        pending.remove(pick)
        run = trials.measure(pick)
        seen[_core(pick.setting)] = seen.get(_core(pick.setting), 0) + 1
        if run.status in ("ok", "over_cap"):  # measured: more recompute at this point is never needed
            pending = [c for c in pending if _but_recompute(c.setting) != _but_recompute(pick.setting)
                       or c.speed > pick.speed]


def expected_wall(runs: list[Run], setting: Setting) -> float:
    """A setting's wall time, start-up and compile included, before it runs: the mean of the runs of
    its kind (compiled or eager: the compile dominates a short run's time), else of every run (0: none)."""
    same = [r.wall_s for r in runs if r.setting.compile == setting.compile]
    walls = same or [r.wall_s for r in runs]
    return sum(walls) / len(walls) if walls else 0.0


def _repeat(trials: _Trials, by_setting: dict[Setting, Candidate], top: int, repeats: int) -> None:
    """The top settings again, round after round in the order they first ran (A B C A B C), until
    each has `repeats` runs; a setting whose repeat failed, or that an out-of-memory run since has
    put over the cap, is dropped, and the rounds end when the next repeat's first wall time no
    longer fits the time left."""
    order = _to_repeat(trials, by_setting, top)
    for round_ in range(1, repeats):
        for first_run in order:
            mine = [r for r in trials.runs if r.setting == first_run.setting]
            pick = by_setting[first_run.setting]
            if any(r.status not in ("ok", "cut") for r in mine) or not pick.fits(trials.scale(), trials.cap_gib):
                continue  # failed or went over the cap once; or now estimated over it
            if trials.left() - first_run.wall_s <= 1:
                trials.note_late([pick], trials.left(), repeat=True)
                return
            trials.measure(pick, repeat=round_)


def base_setting(cfg: RunConfig, lists: list[str]) -> Setting:
    """The config's own point of the space."""
    par = cfg.parallel
    return Setting(micro_batch=cfg.train.micro_batch, ac_stride=tuple((n, par.ac_stride.get(n, 0)) for n in lists),
                   group=tuple((n, par.group.get(n, 1)) for n in lists) if par.fsdp == "block" else (),
                   compile=par.compile or par.cuda_graphs, cuda_graphs=par.cuda_graphs)


def prepare_out(out: Path) -> None:
    """The output folder: new or empty, so no run of an older search is read as this one's."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LaunchError(f"--out {out}: exists and is not an empty folder; remove it or name another")
    out.mkdir(parents=True, exist_ok=True)

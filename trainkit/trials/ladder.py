"""`trainkit ladder`: what each optimisation is worth, measured one switch at a time in one command.

    trainkit ladder trainkit/configs/pi05_baseline.toml --set data.shards=OUT     # the default rungs
    trainkit ladder BASE.toml --target OPT.toml --rungs block_fsdp,compile --steps 20 --out runs/ladder

The ladder starts from the config as it is (`baseline`) and turns the switches of `RUNGS` on one
at a time, each rung keeping the switches of the rungs below it that ran. The default order is the
write-ups' (slot pruning, uint8 host-to-device, per-block FSDP, prefetch, grouping, compile, fused
AdamW, the sync-free non-finite check, expandable segments, mask-free attention, the target's
Inductor settings, CUDA graphs, FP8, then the larger micro-batch with recompute re-tuned); `--rungs` picks and orders others. Values that depend on the family (the FSDP
grouping, the micro-batch, the recompute stride) come from the target config: `--target`, by
default the baseline's sibling with "baseline" replaced by "optimised" in its name.

Each rung is one `trainkit run` in its own process (trainkit/trials/run.py), from the same seed and
data: `--warmup` steps (compilation, allocator, loader; a `--profile-steps` torch.profiler window
sits inside them, see trainkit/observe/profile.py), then `--steps` measured steps. Per rung: step time,
samples/s per GPU, MFU, peak memory (the run's metric intervals over the measured steps), exposed
communication and idle time (the profile window), data wait, the gain in samples/s over the
previous rung that ran and over `baseline`, and loss parity with `baseline` over every step.

A rung is skipped, with the reason, when trainkit or the family has no such switch (a config key
that does not exist yet is simply not there: the rung runs once it is), when its switch is already
on, or when the target has no value for it; it is refused when it needs CUDA and there is none; a
rung that fails (out of memory, a compile error, a crash, the time limit) is recorded with its
error, and the ladder goes on without its switch. A SIGINT / SIGTERM (trainkit/trials/signals.py)
stops the rung in progress, which is recorded as "stopped", and ends the ladder there. Output
(trainkit/trials/ladder_report.py): a table on the terminal, ladder.json, ladder.md, a step-time
waterfall and a loss overlay (PNG), in `--out`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainkit.config import ModelConfig, RunConfig, load_config
from trainkit.errors import ConfigError, LaunchError
from trainkit.errors import ModelConfigError
from trainkit.trials.run import WEEK_S, Trial, TrialError, TrialResult, check_flag, run_trial, toml_value
from trainkit.trials.signals import Interrupted

FROM_TARGET = "<target>"  # a rung value taken from the target config (family-specific)
Parity = Literal["abs", "rel", "none"]
RungStatus = Literal["ok", "skipped", "refused", "failed", "stopped"]


@dataclass(frozen=True)
class Rung:
    """One switch (or a few that belong together) turned on over the rungs below it."""

    name: str  # the --rungs word
    title: str  # the write-ups' name
    sets: Mapping[str, Any]  # dotted config key -> value (FROM_TARGET: the target config's)
    needs_cuda: bool = False  # refused on a machine without CUDA
    # how its losses are held to baseline's: mean |diff| ("abs", bf16 switches), mean relative
    # diff ("rel", FP8), or not at all ("none": it changes the batch, so other losses are right)
    parity: Parity = "abs"
    skip_empty: bool = False  # a FROM_TARGET value that is empty ([]: no FP8 linear) skips the rung


RUNGS: tuple[Rung, ...] = (
    Rung("slot_pruning", "camera-slot pruning", {"data.prune_slots": True}),
    Rung("uint8_h2d", "uint8 host-to-device", {"data.h2d_dtype": "uint8"}),
    Rung("block_fsdp", "per-block FSDP", {"parallel.fsdp": "block"}),
    Rung("prefetch", "prefetch", {"parallel.prefetch": True}),
    Rung("grouping", "grouping", {"parallel.group": FROM_TARGET}),
    Rung("compile", "torch.compile", {"parallel.compile": True}),
    Rung("fused_adamw", "fused AdamW", {"optim.fused": True}),
    Rung("deferred_check", "sync-free non-finite check", {"train.nonfinite_check": "deferred"}),
    Rung("expandable_segments", "expandable segments", {"parallel.expandable_segments": True}),
    Rung("mask_free_attention", "mask-free attention", {"parallel.attention": "varlen"}),
    Rung("inductor", "Inductor settings", {"parallel.inductor": FROM_TARGET}, skip_empty=True),
    Rung("cuda_graphs", "CUDA graphs", {"parallel.cuda_graphs": True}, needs_cuda=True),
    Rung("fp8", "FP8", {"parallel.float8_modules": FROM_TARGET}, needs_cuda=True, parity="rel", skip_empty=True),
    Rung("micro_batch", "larger micro-batch, recompute re-tuned",
         {"train.micro_batch": FROM_TARGET, "train.global_batch": FROM_TARGET, "parallel.ac_stride": FROM_TARGET}, parity="none"),
)
BY_NAME = {r.name: r for r in RUNGS}


@dataclass(frozen=True, kw_only=True)
class LadderSpec:
    """What to climb and how to measure it."""

    config: Path  # the baseline TOML
    overrides: tuple[str, ...] = ()  # `--set` texts for every rung (data.shards, ...)
    target: Path | None = None  # where FROM_TARGET values come from
    out: Path  # ladder.json, ladder.md, the PNGs, rungs/NN-name/ (one run folder per rung)
    warmup: int = 10  # steps before the measured ones (the profile window is inside them)
    steps: int = 20  # measured steps
    profile_steps: int = 3  # torch.profiler window (0: none)
    nproc: int = 1  # processes per rung (torchrun for > 1)
    rung_timeout_s: float = 900.0
    parity_abs: float = 1e-3  # mean |loss diff| vs baseline, "abs" rungs
    parity_rel: float = 0.02  # mean relative loss diff vs baseline, "rel" rungs

    def __post_init__(self) -> None:
        from trainkit.observe.profile import WARMUP
        if self.steps < 1 or self.warmup < 0 or self.profile_steps < 0 or self.nproc < 1:
            raise LaunchError(f"ladder: needs --steps >= 1, --warmup >= 0, --profile-steps >= 0, --nproc >= 1 "
                              f"(got {self.steps}, {self.warmup}, {self.profile_steps}, {self.nproc})")
        if self.profile_steps and self.warmup < WARMUP + self.profile_steps:
            raise LaunchError(f"ladder: --warmup {self.warmup} must hold the profile window (steps {WARMUP} .. "
                              f"{WARMUP + self.profile_steps - 1}): use --warmup >= {WARMUP + self.profile_steps} "
                              f"or --profile-steps 0")
        check_flag("--rung-timeout", self.rung_timeout_s, high=WEEK_S)
        check_flag("--parity-abs", self.parity_abs, zero=True)
        check_flag("--parity-rel", self.parity_rel, zero=True)

    @property
    def log_every(self) -> int:
        """Metric interval length: one that ends exactly at the warm-up and at the last step."""
        return math.gcd(self.warmup, self.steps) if self.warmup else self.steps

    def measure_sets(self) -> dict[str, Any]:
        """What every rung's run gets on top of the config: its length, interval and profile window."""
        return {"train.steps": self.warmup + self.steps, "output.log_every": self.log_every,
                "output.profile_steps": self.profile_steps, "output.checkpoint_every": 0,
                "output.resume": False}


@dataclass
class Measured:
    """One rung's figures over its measured steps (None where the device cannot give one)."""

    step_time_s: float
    samples_per_s_gpu: float
    mfu: float | None
    peak_mem_gib: float | None
    data_wait_ms: float  # per step, host time blocked on the loader
    exposed_comm_ms: float | None  # per step, from the profile window; None without one
    idle_ms: float | None  # per step, no kernel running (launch gaps, host waits); profile window
    micro_batch: int
    # (slowest, fastest) samples/s/GPU of its measured intervals: two rungs whose spreads overlap differ
    # by no more than the run's own noise (`compare`)
    spread: tuple[float, float] | None = None


@dataclass
class RungResult:
    name: str
    title: str
    status: RungStatus
    sets: dict[str, Any]  # this rung's own switches, resolved
    applied: dict[str, Any] = field(default_factory=dict)  # every switch on at this rung (with the ones below)
    reason: str = ""  # why skipped / refused
    error: TrialError | None = None  # why failed
    measured: Measured | None = None
    losses: dict[int, float] = field(default_factory=dict)
    parity: dict[str, Any] | None = None  # {"rule", "value", "tolerance", "ok"} vs baseline
    gain_prev: float | None = None  # samples/s over the previous rung that ran
    gain_base: float | None = None  # samples/s over baseline
    noise_prev: bool = False  # gain_prev is noise: the two rungs' interval spreads overlap
    noise_base: bool = False  # gain_base is noise, the same way
    out_dir: str = ""


def resolve_rungs(names: str | None) -> list[Rung]:
    """The rungs of `--rungs a,b,c` (None: the default order); LaunchError naming an unknown one."""
    if names is None:
        return list(RUNGS)
    picked = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in picked if n not in BY_NAME]
    if unknown or not picked:
        what = f"unknown rung {unknown[0]!r}" if unknown else "no rung named"
        raise LaunchError(f"--rungs: {what}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in picked]


def describe_rung(rung: Rung) -> str:
    """One line of `trainkit ladder --list-rungs`: the rung's name, what it is, the keys it sets."""
    fixed = [f"{k} = {toml_value(v)}" for k, v in rung.sets.items() if v != FROM_TARGET]
    target = [k for k, v in rung.sets.items() if v == FROM_TARGET]
    sets = ", ".join([*fixed, *([f"{', '.join(target)} from the target config"] if target else [])])
    notes = [*(["needs CUDA"] if rung.needs_cuda else []),
             *{"abs": [], "rel": ["losses held to a relative bound"], "none": ["no loss parity: another batch"]}[rung.parity]]
    width = max(len(r.name) for r in RUNGS)
    return f"{rung.name.ljust(width)}  {rung.title}: {sets}" + (f" ({'; '.join(notes)})" if notes else "")


def default_target(config: Path) -> Path | None:
    """The optimised sibling of a `*baseline*` config, if it exists."""
    if "baseline" not in config.name:
        return None
    sibling = config.with_name(config.name.replace("baseline", "optimised"))
    return sibling if sibling.exists() else None


def _dotted(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node


def _current(cfg: RunConfig, key: str) -> Any:
    """The value `key` has in `cfg` (model.* keys: in the family's built config)."""
    if key.startswith("model.") and key.count(".") == 1:
        import dataclasses

        from trainkit.models import build_config
        mcfg = build_config(cfg.model.family, cfg.model.preset, cfg.model.overrides)
        return dataclasses.asdict(mcfg)[key.split(".", 1)[1]]
    return _dotted(cfg.to_dict(), key)


def plan_rung(rung: Rung, spec: LadderSpec, applied: Mapping[str, Any], target: RunConfig | None,
              cuda: bool) -> tuple[RungStatus | None, str, dict[str, Any]]:
    """(None, "", resolved sets) for a rung to run over `applied`; else (skipped / refused, reason, sets)."""
    from datakit.toml_values import toml_value

    if rung.needs_cuda and not cuda:
        return "refused", f"{', '.join(rung.sets)} needs CUDA, and this machine has none (torch.cuda.is_available() " \
                          f"is False)", dict(rung.sets)
    sets: dict[str, Any] = {}
    for key, value in rung.sets.items():
        if value == FROM_TARGET:
            if target is None:
                return "skipped", f"{key} comes from the target config; none given (--target OPT.toml)", sets
            value = _dotted(target.to_dict(), key)
        sets[key] = value
    empty = [k for k in rung.sets if rung.skip_empty and rung.sets[k] == FROM_TARGET and not sets[k]]
    if empty:
        return "skipped", f"the target config sets no {empty[0]} (empty there)", sets
    missing = [k for k in sets if not _trainkit_has(k)]
    if missing:
        return "skipped", f"trainkit has no {missing[0]} (yet): the rung runs once the key exists", sets
    before = load_config(spec.config, [*spec.overrides, *(f"{k}={toml_value(v)}" for k, v in applied.items())])
    try:
        after = load_config(spec.config, [*spec.overrides,
                                          *(f"{k}={toml_value(v)}" for k, v in {**applied, **sets}.items())])
        new = {k: _current(after, k) for k in sets}
    except ConfigError as e:  # a value the key does not take
        return "skipped", str(e), sets
    except (ModelConfigError, KeyError):
        keys = ", ".join(k for k in sets if k.startswith("model.")) or ", ".join(sets)
        return "skipped", f"family {before.model.family!r} has no {keys} (not a field of its config)", sets
    if all(_current(before, k) == v for k, v in new.items()):
        now = ", ".join(f"{k}={v!r}" for k, v in new.items())
        return "skipped", f"already on in the baseline or a rung below ({now})", sets
    return None, "", sets


def _trainkit_has(key: str) -> bool:
    """Whether RunConfig has the dotted `key` (a model.* key is the family's to have: see _current)."""
    import dataclasses
    import typing

    cls: Any = RunConfig
    for part in key.split("."):
        if cls is ModelConfig:
            return True
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            return False
        cls = hints[part]
    return True


def measure(result: TrialResult, spec: LadderSpec, micro_batch: int) -> Measured:
    """The figures of a finished rung over its measured steps (steps >= warmup)."""
    rows = [h for h in result.intervals if h["step"] + 1 - h["steps"] >= spec.warmup]
    time_s = [h["steps"] * h["step_time_s"] for h in rows]
    total = sum(time_s)
    mfu = None if any(h["mfu"] is None for h in rows) else sum(h["mfu"] * t for h, t in zip(rows, time_s)) / total
    mem = [h["peak_mem_gib"] for h in result.intervals]
    prof = result.profile or {}
    steps = sum(h["steps"] for h in rows)
    return Measured(step_time_s=total / steps,
                    samples_per_s_gpu=sum(h["samples_per_s_gpu"] * t for h, t in zip(rows, time_s)) / total,
                    mfu=mfu, peak_mem_gib=None if None in mem else max(mem),
                    data_wait_ms=1e3 * sum(h["data_wait_s"] * h["steps"] for h in rows) / steps,
                    exposed_comm_ms=prof.get("exposed_comm_ms"), idle_ms=prof.get("idle_ms"),
                    micro_batch=micro_batch, spread=(min(h["samples_per_s_gpu"] for h in rows),
                                                     max(h["samples_per_s_gpu"] for h in rows)))


def compare(m: Measured, other: Measured) -> tuple[float, bool]:
    """(samples/s of `m` over `other`'s, whether that ratio is noise: the ranges of the two rungs'
    interval speeds overlap, so the run-to-run spread alone could give it)."""
    ratio = m.samples_per_s_gpu / other.samples_per_s_gpu
    if m.spread is None or other.spread is None:
        return ratio, False
    return ratio, m.spread[0] <= other.spread[1] and other.spread[0] <= m.spread[1]


def parity(rung: Rung, losses: Mapping[int, float], base: Mapping[int, float], spec: LadderSpec) -> dict[str, Any]:
    """The rung's losses against baseline's over their common steps, by the rung's rule."""
    steps = sorted(set(losses) & set(base))
    if rung.parity == "none" or not steps:
        why = "changes the batch: other losses are expected" if rung.parity == "none" else "no common steps"
        return {"rule": "none", "value": None, "tolerance": None, "ok": None, "why": why, "steps": len(steps)}
    diffs = [abs(losses[s] - base[s]) for s in steps]
    if rung.parity == "rel":
        value = sum(d / max(abs(base[s]), 1e-12) for d, s in zip(diffs, steps)) / len(steps)
        tol = spec.parity_rel
    else:
        value, tol = sum(diffs) / len(steps), spec.parity_abs
    return {"rule": "mean relative |diff|" if rung.parity == "rel" else "mean |diff|", "value": value,
            "tolerance": tol, "ok": value <= tol, "max_abs_diff": max(diffs), "steps": len(steps)}


def run_ladder(spec: LadderSpec, rungs: Sequence[Rung], *, cuda: bool | None = None,
               echo: Any = print) -> list[RungResult]:
    """Baseline, then each rung over the ones that ran; one process per rung. `echo` gets a line per
    rung. Stopped by a signal (Interrupted), the list ends with the rung it stopped, as "stopped"."""
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    load_config(spec.config, list(spec.overrides))  # a bad baseline fails here, in one line
    target = load_config(spec.target, required=False) if spec.target else None  # as written, not under --set
    results: list[RungResult] = []
    applied: dict[str, Any] = {}  # the switches of the rungs that ran
    base = prev = None
    for i, rung in enumerate([Rung("baseline", "baseline", {}), *rungs]):
        status, reason, sets = (None, "", {}) if i == 0 else plan_rung(rung, spec, applied, target, cuda)
        res = RungResult(name=rung.name, title=rung.title, status=status or "ok", sets=sets, reason=reason)
        if status is None:
            try:
                _climb(res, spec.out / "rungs" / f"{i:02d}-{rung.name}", {**applied, **sets}, spec)
            except Interrupted as stop:  # the rung's trial is stopped: the ladder ends with what finished
                res.status, res.reason = "stopped", f"stopped by {stop.name} before it finished; not measured"
                results.append(res)
                echo(_line(i, res))
                break
        if res.measured is not None:
            applied.update(sets)
            base = base or (res if i == 0 else None)
            if base is not None:
                res.parity = parity(rung, res.losses, base.losses, spec) if i else None
                res.gain_base, res.noise_base = compare(res.measured, base.measured)
            if prev is not None:
                res.gain_prev, res.noise_prev = compare(res.measured, prev.measured)
            prev = res
        results.append(res)
        echo(_line(i, res))
    return results


def _climb(res: RungResult, out: Path, applied: dict[str, Any], spec: LadderSpec) -> None:
    """Run one rung with `applied` switches into `out`; its figures, or its error."""
    trial = run_trial(Trial(config=spec.config, out_dir=out, overrides=spec.overrides,
                            overlay={**applied, **spec.measure_sets()}, nproc=spec.nproc,
                            timeout_s=spec.rung_timeout_s, name=res.name), replace=True)
    res.out_dir, res.losses, res.applied = str(out), trial.losses, applied
    if not trial.ok:
        res.status, res.error = "failed", trial.error
    elif not any(h["step"] + 1 - h["steps"] >= spec.warmup for h in trial.intervals):
        res.status, res.error = "failed", TrialError(kind="crash", type="NoMeasurement",
                                                     message=f"{out}: no metric interval after the warm-up")
    else:
        res.measured = measure(trial, spec, _micro_batch(spec, applied))


def _micro_batch(spec: LadderSpec, applied: Mapping[str, Any]) -> int:
    from datakit.toml_values import toml_value
    return load_config(spec.config, [*spec.overrides, *(f"{k}={toml_value(v)}" for k, v in applied.items())]
                       ).train.micro_batch


def _line(i: int, r: RungResult) -> str:
    """One progress line per rung, as it finishes."""
    if r.status == "ok" and r.measured is not None:
        m = r.measured
        gain = f", x{r.gain_base:.2f} baseline{' (noise)' if r.noise_base else ''}" if r.gain_base is not None and i else ""
        par = "" if not r.parity or r.parity["ok"] is None else \
            f", parity {'ok' if r.parity['ok'] else 'BROKEN'} ({r.parity['value']:.2e})"
        return (f"ladder: {i:2d} {r.name}: {m.step_time_s * 1e3:.0f} ms/step, {m.samples_per_s_gpu:.2f} "
                f"samples/s/GPU{gain}{par}")
    if r.status == "failed" and r.error is not None:
        return f"ladder: {i:2d} {r.name}: FAILED ({r.error.kind}: {r.error.message})"
    return f"ladder: {i:2d} {r.name}: {r.status} ({r.reason})"

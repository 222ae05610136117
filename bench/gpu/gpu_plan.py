"""A GPU bench plan (`bench/gpu/plans/<family>.toml`): what `bench/gpu/gpu.py` measures for one family, as
data. Read and checked here without torch or trainkit, so a test can load every plan cheaply
(tests/bench/test_bench_gpu_plans.py also loads each variant's config through trainkit.config).

A plan, top to bottom (every key is checked: an unknown one is refused, as trainkit's configs do):

    family = "pi05"                    # the trainkit family every variant's config must be
    title = "..."                      # one line for the table's heading
    config = "pi05_optimised.toml"     # under trainkit/configs/: a variant's config unless it names one
    baseline = "baseline"              # the variant every `x baseline` ratio is taken against
    steps = 20                         # train.steps of a variant (a variant may set its own)
    skip = 8                           # steady state: metric intervals from this step on (compile, warm-up)
    log_every = 4                      # output.log_every: one metric interval per this many steps
    profile_steps = 3                  # output.profile_steps of a variant with `profile = true`
    nproc = 1                          # processes (GPUs) per variant and for the probe (--nproc)
    timeout_s = 300                    # one variant's limit, start-up and compilation included
    budget_s = 560                     # nothing starts after this many seconds of the call (--budget-s)
    min_start_s = 30                   # ... nor with fewer than this left

    [data]                             # generated shards: PNG image columns, datakit convert (no codec needed)
    cameras = ["observation.images.top", "observation.images.wrist"]
    height = 224; width = 224; episodes = 8; length = 80

    [probe]                            # the plain-PyTorch reference run beside the trainer (GPU only)
    file = "pi05_fsdp_probe.py"        # in bench/gpu/probes/ (exact copies of ../shared/probes/, SHA256SUMS)
    args = ["opt_compile_noac_mbs32"]  # its settings (argv); each prints one JSON row
    compare = "opt_compile_noac_mbs32" # the row `x probe` ratios use (default: the first of args)

    [cpu]                              # --cpu: the dry run of every variant on the CPU
    overrides = ["model.preset=tiny", ...]  # applied after a variant's own: tiny shapes, CUDA-only switches off
    steps = 3; skip = 1; log_every = 1; timeout_s = 120; budget_s = 420
    [cpu.data]                         # smaller frames (any [data] key; the rest as [data])
    height = 64; width = 64; episodes = 4; length = 40

    [[variants]]                       # one `trainkit run` each, in its own process (trainkit.trials)
    name = "optimised_mbs32"           # [A-Za-z0-9_.-]; its run folder and its row
    group = "main"                     # what `--only GROUP` picks; a call without --only runs "main"
    config = "pi05_optimised.toml"     # default: the plan's
    overrides = ["train.micro_batch=32"]    # `--set` texts (the keys the harness sets are refused here)
    env = { TORCHINDUCTOR_MAX_AUTOTUNE_GEMM = "1" }   # extra environment of the run
    steps = 200                        # default: the plan's
    profile = true                     # torch.profiler over profile_steps steps: the summary in the JSON
    compare = "optimised"              # loss parity and samples/s ratio against that variant
    probe = "compile_mbs128"           # the probe row of its `x probe` (default: [probe] compare)
    if_failed = "optimised"            # run only if that variant did not finish ok in this call
    init_from = "random:openpi"        # model.init_from: a random checkpoint of its model in that format
    timeout_s = 400                    # default: the plan's
    note = "..."                       # why it is there (into the JSON)

    [[runs]]                           # a trainkit command that runs trials itself, as a process
    name = "ladder"; group = "ladder"
    kind = "ladder"                    # ladder | tune | inspect (`python -m trainkit.cli KIND CONFIG ...`)
    config = "pi05_baseline.toml"
    overrides = []                     # `--set` texts (data.shards is the harness's)
    args = ["--steps", "20"]           # the command's own flags
    timeout_s = 1800
    [runs.cpu]                         # --cpu: these replace config / overrides / args where given
    args = ["--rungs", "slot_pruning,fp8", "--steps", "2"]
"""
from __future__ import annotations

import ast
import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "bench" / "gpu" / "plans"
PROBES = ROOT / "bench" / "gpu" / "probes"
CONFIGS = ROOT / "trainkit" / "configs"
RunKind = Literal["ladder", "tune", "inspect"]
RUN_KINDS: tuple[str, ...] = ("ladder", "tune", "inspect")
# --set keys the harness owns: a plan names them through its own fields (steps, profile, init_from)
OWNED = ("data.shards", "output.dir", "train.steps", "output.log_every", "output.profile_steps", "output.resume",
         "output.progress", "model.init_from")
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class PlanError(Exception):
    """A plan file that cannot be run as written; one line naming the file and the key."""


@dataclass(frozen=True, kw_only=True)
class Data:
    cameras: tuple[str, ...]  # LeRobot image columns, in index order
    height: int
    width: int
    episodes: int
    length: int  # frames per episode


@dataclass(frozen=True, kw_only=True)
class Probe:
    file: str  # a file of bench/gpu/probes/
    args: tuple[str, ...]  # its settings, run in one process
    compare: str = ""  # the row ratios are against ("" -> args[0])
    timeout_s: float = 300.0
    group: str = "main"


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    config: str = ""  # "" -> the plan's
    group: str = "main"
    overrides: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    steps: int = 0  # 0 -> the plan's
    profile: bool = False
    compare: str = ""
    probe: str = ""
    if_failed: str = ""
    init_from: str = ""  # "random:<format>" or ""
    # train from `trainkit encode-backbone`'s cache of the call's shards (built first in the same call, at the
    # variant's settings; its seconds recorded): the head alone, reported apart, no ratio to the baseline or probe
    cached_backbone: bool = False
    timeout_s: float = 0.0  # 0 -> the plan's
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class RunCpu:
    config: str = ""
    overrides: tuple[str, ...] | None = None
    args: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Run:
    name: str
    kind: RunKind
    config: str = ""
    group: str = "main"
    overrides: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    cpu: RunCpu = RunCpu()
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Cpu:
    overrides: tuple[str, ...]
    data: Data
    steps: int = 3
    skip: int = 1
    log_every: int = 1
    timeout_s: float = 120.0
    budget_s: float = 420.0


@dataclass(frozen=True, kw_only=True)
class Plan:
    path: Path
    family: str
    config: str
    baseline: str
    data: Data
    cpu: Cpu
    title: str = ""
    steps: int = 20
    skip: int = 8
    log_every: int = 4
    profile_steps: int = 3
    nproc: int = 1
    timeout_s: float = 300.0
    budget_s: float = 560.0
    min_start_s: float = 30.0
    probe: Probe | None = None
    variants: tuple[Variant, ...] = ()
    runs: tuple[Run, ...] = ()

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def groups(self) -> list[str]:
        items = [*self.variants, *self.runs, *([self.probe] if self.probe else [])]
        return sorted({x.group for x in items})


def plan_path(arg: str | Path) -> Path:
    """A plan file, or a family's plan by name (`pi05` -> bench/gpu/plans/pi05.toml)."""
    p = Path(arg)
    if p.suffix == ".toml" or p.exists():
        return p
    return PLANS / f"{arg}.toml"


def all_plans() -> list[Path]:
    return sorted(PLANS.glob("*.toml"))


def load_plan(arg: str | Path) -> Plan:
    """The plan of file (or family) `arg`, every key and every cross-reference checked."""
    path = plan_path(arg)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(p.stem for p in all_plans())
        raise PlanError(f"{path}: no such plan (plans: {known})") from None
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{path}: not valid TOML ({e})") from None
    where = str(path)
    data = _build(Data, raw.pop("data", None), f"{where} [data]")
    cpu_raw = dict(raw.pop("cpu", None) or {})
    cpu_data = {**dataclasses.asdict(data), **_table(cpu_raw.pop("data", {}), f"{where} [cpu.data]")}
    cpu = _build(Cpu, {**cpu_raw, "data": _build(Data, cpu_data, f"{where} [cpu.data]")}, f"{where} [cpu]")
    probe = raw.pop("probe", None)
    variants = [_build(Variant, v, f"{where} [[variants]] #{i + 1}") for i, v in enumerate(raw.pop("variants", []))]
    runs = []
    for i, r in enumerate(raw.pop("runs", [])):
        r = _table(r, f"{where} [[runs]] #{i + 1}")
        rcpu = _build(RunCpu, r.pop("cpu", {}), f"{where} [[runs]] #{i + 1} cpu")
        runs.append(_build(Run, {**r, "cpu": rcpu}, f"{where} [[runs]] #{i + 1}"))
    plan = _build(Plan, {**raw, "path": path, "data": data, "cpu": cpu, "variants": tuple(variants),
                         "runs": tuple(runs),
                         "probe": None if probe is None else _build(Probe, probe, f"{where} [probe]")}, where)
    _check(plan)
    return plan


def _table(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise PlanError(f"{where}: must be a table, got {raw!r}")
    return dict(raw)


def _build(cls: type, raw: Any, where: str) -> Any:
    """`cls(**raw)` with unknown and missing keys refused and TOML arrays made tuples."""
    raw = _table(raw if raw is not None else {}, where)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise PlanError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(fields)})")
    missing = [n for n, f in fields.items() if n not in raw and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise PlanError(f"{where}: {missing[0]!r} is required")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def _check(plan: Plan) -> None:
    where = str(plan.path)
    names = [v.name for v in plan.variants] + [r.name for r in plan.runs]
    for n in names:
        if not NAME.match(n) or n in ("probe", "all"):
            raise PlanError(f"{where}: {n!r} is not a usable name ([A-Za-z0-9_.-], not 'probe' or 'all')")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PlanError(f"{where}: name {dup[0]!r} is used twice")
    items = [*plan.variants, *plan.runs, *([plan.probe] if plan.probe else [])]
    clash = sorted({getattr(x, "name", "probe") for x in items for y in items
                    if getattr(x, "name", "probe") == y.group and x is not y})
    if clash:  # --only takes both: a name may only be its own one-item group
        raise PlanError(f"{where}: {clash[0]!r} is both a name and a group of other items")
    variants = {v.name for v in plan.variants}
    if plan.baseline not in variants:
        raise PlanError(f"{where}: baseline {plan.baseline!r} is not a variant")
    rows = _probe_rows(plan) if plan.probe else ()
    for v in plan.variants:
        at = f"{where} variant {v.name!r}"
        for ref, key in ((v.compare, "compare"), (v.if_failed, "if_failed")):
            if ref and (ref not in variants or ref == v.name):
                raise PlanError(f"{at}: {key} = {ref!r} is not another variant")
        if v.probe and v.probe not in rows:
            raise PlanError(f"{at}: probe = {v.probe!r} is not a setting the probe runs ({', '.join(rows)})")
        if v.cached_backbone and (v.probe or v.name == plan.baseline or (v.compare and not
                                                                          plan.variant(v.compare).cached_backbone)):
            raise PlanError(f"{at}: a cached_backbone run trains the head alone: no probe, not the baseline, "
                            "compared with another cached_backbone variant only")
        if v.init_from and not re.match(r"^random:[a-z0-9_]+$", v.init_from):
            raise PlanError(f"{at}: init_from must be 'random:<format>', got {v.init_from!r}")
        if any(not isinstance(x, str) for x in v.env.values()):
            raise PlanError(f"{at}: env values are strings")
        check_overrides(v.overrides, at)
    for r in plan.runs:
        if r.kind not in RUN_KINDS:
            raise PlanError(f"{where} run {r.name!r}: kind must be one of {', '.join(RUN_KINDS)}, got {r.kind!r}")
        for sets in (r.overrides, r.cpu.overrides or ()):
            if any(s.partition("=")[0].strip() == "data.shards" for s in sets):
                raise PlanError(f"{where} run {r.name!r}: data.shards is set by the harness")
    check_overrides(plan.cpu.overrides, f"{where} [cpu]")


def _probe_rows(plan: Plan) -> tuple[str, ...]:
    """The probe's settings the plan runs, each checked against the probe file's VARIANTS."""
    probe = plan.probe
    where = f"{plan.path} [probe]"
    path = PROBES / probe.file
    if not path.is_file() or path.parent != PROBES:
        raise PlanError(f"{where}: {probe.file!r} is not a file of {PROBES}")
    known = probe_settings(path)
    bad = [a for a in probe.args if a not in known]
    if bad or not probe.args:
        raise PlanError(f"{where}: {bad[0] if bad else 'args'!r}: not a setting of {probe.file} ({', '.join(known)})")
    if probe.compare and probe.compare not in probe.args:
        raise PlanError(f"{where}: compare = {probe.compare!r} is not one of args")
    return probe.args


def probe_settings(path: Path) -> list[str]:
    """The keys of a probe file's top-level `VARIANTS = {...}` (read, not imported: probes need CUDA)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "VARIANTS" for t in node.targets):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    return []


def check_overrides(sets: tuple[str, ...], where: str) -> None:
    for s in sets:
        key, sep, _ = s.partition("=")
        if not sep:
            raise PlanError(f"{where}: override {s!r} is not key=value")
        if key.strip() in OWNED:
            raise PlanError(f"{where}: {key.strip()} is set by the harness (plan keys: steps, profile, init_from)")


def set_key(text: str) -> str:
    return text.partition("=")[0].strip()


def variant_sets(plan: Plan, v: Variant, *, cpu: bool, shards: str | Path, init_from: str | Path = "",
                 extra: tuple[str, ...] = ()) -> list[str]:
    """Every `--set` of variant `v`'s trial but output.dir (the trial's own): the harness's run
    settings, the variant's overrides, the call's `extra` (--set), on --cpu the plan's CPU
    overrides last (they win)."""
    steps = plan.cpu.steps if cpu else (v.steps or plan.steps)
    log_every = plan.cpu.log_every if cpu else plan.log_every
    sets = [f"data.shards={shards}", f"train.steps={steps}", f"output.log_every={log_every}", "output.resume=false",
            *v.overrides, *extra]
    if v.profile and not cpu:  # the profiler window opens after 5 steps: a CPU dry run has 2-3
        sets.append(f"output.profile_steps={plan.profile_steps}")
    if init_from:
        sets.append(f"model.init_from={init_from}")
    return [*sets, *(plan.cpu.overrides if cpu else ())]


def cpu_replaced(plan: Plan, v: Variant) -> list[str]:
    """The variant's overrides a CPU dry run replaces (CUDA-only switches, full shapes)."""
    keys = {set_key(s) for s in plan.cpu.overrides}
    return [s for s in v.overrides if set_key(s) in keys]


def variant_config(plan: Plan, v: Variant) -> Path:
    return CONFIGS / (v.config or plan.config)


def run_parts(plan: Plan, r: Run, *, cpu: bool) -> tuple[Path, tuple[str, ...], tuple[str, ...]]:
    """(config, overrides, args) of run `r`, its [runs.cpu] replacing each one it gives on --cpu."""
    if not cpu:
        return CONFIGS / (r.config or plan.config), r.overrides, r.args
    c = r.cpu
    return (CONFIGS / (c.config or r.config or plan.config), r.overrides if c.overrides is None else c.overrides,
            r.args if c.args is None else c.args)

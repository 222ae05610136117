"""The GPU bench of a model family: its plan's trainer variants, each one `trainkit run` in its own
process (`trainkit.trials.run_trial`), the probe beside them, one JSON and one table.

    python3 bench/gpu/gpu.py pi05 --out $OUT                      # the plan's "main" group, on the GPU
    python3 bench/gpu/gpu.py gr00t --out $OUT --only candidates probe  # variants, runs or groups by name ("all")
    python3 bench/gpu/gpu.py bench/gpu/plans/dreamzero.toml --out $OUT --budget-s 300 --set parallel.compile=false
    python3 bench/gpu/gpu.py pi05 --out /tmp/x --cpu              # dry run: every variant of the plan, tiny, CPU

A plan (bench/gpu/plans/<family>.toml; every key in bench/gpu/gpu_plan.py) names the variants as override
lists over a config of trainkit/configs/, the probe, steps, what to profile, timeouts and a budget.
A call, in this order:
1. shards: a LeRobot v2.1 dataset with PNG image columns (`datakit.synth`; the GPU machine has no
   video decoder) converted by `datakit convert`, at the plan's cameras and frame size, cached under
   --work by that shape;
2. the probe (bench/gpu/probes/, exact copies of ../shared/probes/) under torchrun: one JSON row per setting;
3. each variant in plan order through run_trial: an OOM, compile error, crash or timeout costs that
   variant only and is recorded as the run's typed error; steady state = the median of the metric
   intervals from the plan's `skip` step on (trainkit.observe.summary);
4. each `[[runs]]` entry: `python -m trainkit.cli ladder | tune | inspect ...` as one process group.
Nothing starts with less than `min_start_s` of the budget left (recorded as skipped); a variant's
limit is its timeout or what is left. The JSON is rewritten after every item, so a call stopped
from outside keeps what finished. Run folders (metrics, trial.log, profile) stay under --work.

--cpu is a dry run of the same path on this machine: every variant (and run) of the plan, or those
of --only, through run_trial with the plan's [cpu] overrides after the variant's own (tiny preset,
float32, no compile / CUDA graphs / FP8 / fused AdamW, a small micro-batch; each variant records
which of its overrides they replaced as `cpu_replaced`), 3 steps, no profiler, smaller frames, one
process, CUDA hidden. Probes need CUDA and NCCL and have no CPU mode: recorded as skipped.

Output: $OUT/<plan>.json and, for ladder / tune runs, their report files ($OUT/<run>.md, PNGs,
<run>_best.toml). The JSON (`schema` "bench.gpu/1", the same for every family):
  plan {file, sha256}, family, mode ("gpu" | "cpu"), the record header of bench/record.py (command,
  commit, dirty, date, machine {host, cpus, load_avg, python, torch, cuda}, card), wall_s, settings {nproc, budget_s, steps, skip,
  log_every, profile_steps, sets (--set, after every variant's own), only, selected}, baseline, data {shards, cameras, height, width, episodes, length, build_s},
  probe {file, sha256, args, compare, command, status, reason, wall_s, rows [the probe's JSON lines], log_tail},
  checkpoints {key: {folder, format, dtype, tensors, bytes, seconds} | {error}},
  variants [{name, group, note, config, overrides, env, cpu_replaced, command, status ("ok" | "oom" |
    "compile_error" | "refused" | "crash" | "timeout" | "skipped"), reason, error {kind, type, message, rank},
    returncode, wall_s, samples_per_s, mfu, peak_mem_gib, step_time_s, data_wait_frac, steady {...},
    cache {folder, command, wall_s, status, summary, log_tail} (a cached_backbone variant: its encode-backbone),
    losses [per step], profile {profile_rank0.json} | null, init_from {checkpoint, load_s}, compare, probe_row,
    vs_baseline, vs_probe {row, ratio}, vs {variant, samples_per_s_ratio, loss {steps, max_abs, mean_abs, mean_rel}},
    log_tail}],
  runs [{name, group, kind, note, command, status ("ok" | "failed" | "timeout" | "skipped"), reason,
    returncode, wall_s, result (ladder.json | tune.json | inspect's JSON), files, log_tail}]
Ratios (bench/gpu/gpu_report.py, which also prints the table of a saved JSON again) are samples/s per
GPU over the baseline's, the probe row's (`samples_s_gpu`) and the compared variant's; loss
differences are step by step over the steps both ran.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "gpu")]
from gpu_plan import (PROBES, Data, Plan, PlanError, Run, Variant, check_overrides, cpu_replaced,  # noqa: E402
                      load_plan, run_parts, set_key, variant_config, variant_sets)
from gpu_report import derive, table  # noqa: E402

from bench.record import header  # noqa: E402
from trainkit.trials import Trial, run_trial  # noqa: E402

SCHEMA = "bench.gpu/1"
STATE_DIM, ACTION_DIM = 8, 7  # of the generated dataset
TASKS = ("pick up the red cube and put it in the bowl", "open the top drawer")
RUN_FILES = {"ladder": {"ladder.md": "{}.md", "ladder_waterfall.png": "{}_waterfall.png",
                        "ladder_losses.png": "{}_losses.png"},
             "tune": {"best.toml": "{}_best.toml"}, "inspect": {}}
KILL_GRACE_S = 10.0


@dataclass
class Call:
    """One invocation: the plan, where things go, the clock, and the results so far."""

    plan: Plan
    out: Path
    work: Path
    cpu: bool
    nproc: int
    budget_end: float
    res: dict[str, Any]
    shards: Path = Path()
    extra: tuple[str, ...] = ()  # --set: after every variant's and run's own overrides
    env: dict[str, str] = field(default_factory=dict)
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant name -> its record

    def left(self) -> float:
        return self.budget_end - time.time()

    def dump(self) -> None:
        derive(self.res)
        path = self.out / f"{self.plan.path.stem}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.res, indent=1, default=str) + "\n")
        tmp.replace(path)


# --- data and checkpoints ----------------------------------------------------------------------------

def make_shards(work: Path, data: Data) -> Path:
    """The generated dataset (PNG image columns, no codec) -> datakit convert -> shard folder,
    kept under `work` by its shape and reused by later calls."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.machine import available_cpus
    from datakit.synth import make_lerobot_dataset

    cams = hashlib.sha256(",".join(data.cameras).encode()).hexdigest()[:8]
    root = work / "data" / f"{len(data.cameras)}cam-{cams}-{data.height}x{data.width}-{data.episodes}x{data.length}"
    out = root / "shards"
    if (out / "checksums.json").exists():
        return out
    shutil.rmtree(root, ignore_errors=True)
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=(data.length,) * data.episodes,
                               height=data.height, width=data.width, cameras=(), image_cameras=data.cameras,
                               blank_cameras=(), state_dim=STATE_DIM, action_dim=ACTION_DIM, tasks=TASKS)
    convert(src, out, ConvertConfig(workers=min(8, available_cpus()), progress=False))
    shutil.rmtree(root / "src")
    return out


def random_weights(folder: Path, cfg: Any, fmt: str, data: Data) -> dict[str, Any]:
    """A random model of run config `cfg` (family, preset, model.*) in checkpoint format `fmt`
    (bfloat16), written through the family's export path, as `trainkit export` writes one. Every
    parameter init leaves at one constant (norm scales at 1, modulations at 0) is perturbed, so no
    load is measured on degenerate values."""
    import torch

    from trainkit.models import build_model, family
    from trainkit.weights.load import write_weights

    fam = family(cfg.model.family)
    if fam.weights is None or fmt not in fam.weights.formats:
        raise ValueError(f"family {cfg.model.family} writes no {fmt!r} checkpoint "
                         f"(formats: {', '.join(fam.weights.formats) if fam.weights else 'none'})")
    t0 = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build_model(cfg.model.family, cfg.model.preset, cfg.model.overrides)
    model.to_empty(device=device)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn_like(p), alpha=0.02)
    tensors = {k: v.to("cpu", torch.bfloat16, copy=True)
               for k, v in fam.weights.export_tensors(model.cfg, model.state_dict(), fmt).items()}
    config = fam.weights.config_json(model.cfg, {"cameras": list(data.cameras), "state_dim": STATE_DIM,
                                                 "action_dim": ACTION_DIM})
    config["dtype"] = "bfloat16"
    metadata = fam.weights.metadata(model.cfg) if fam.weights.metadata else {}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the runs are other processes: leave them the GPU
    write_weights(folder, tensors, config, metadata=metadata)
    return {"folder": str(folder), "format": fmt, "dtype": "bfloat16", "tensors": len(tensors),
            "bytes": sum(f.stat().st_size for f in folder.iterdir()), "seconds": round(time.perf_counter() - t0, 2)}


def weights_for(call: Call, v: Variant, sets: list[str]) -> str:
    """The folder of variant `v`'s `init_from = "random:<format>"` checkpoint, written once per call."""
    from trainkit.config import load_config

    cfg = load_config(variant_config(call.plan, v), sets, required=False)
    fmt = v.init_from.partition(":")[2]
    key = f"{cfg.model.family}-{cfg.model.preset}-{fmt}"
    book = call.res["checkpoints"]
    if key not in book:
        folder = call.work / "checkpoints" / key
        shutil.rmtree(folder, ignore_errors=True)
        try:
            book[key] = random_weights(folder, cfg, fmt, call.plan.cpu.data if call.cpu else call.plan.data)
        except Exception as e:  # noqa: BLE001 - recorded; the variant reports it
            book[key] = {"error": f"{type(e).__name__}: {e}"}
    if "error" in book[key]:
        raise RuntimeError(book[key]["error"])
    return book[key]["folder"]


def backbone_cache(call: Call, v: Variant, config: Path, sets: list[str]) -> dict[str, Any]:
    """`trainkit encode-backbone` over the call's shards at variant `v`'s settings (the same config and
    --set texts as its trial, so the fingerprint is the trial's): the folder, its seconds and summary."""
    folder = call.work / "backbone-cache" / v.name
    cmd = [sys.executable, "-m", "trainkit.cli", "encode-backbone", str(config), "--out", str(folder), "--force",
           "--no-progress", "--batch", "4" if call.cpu else "32", *[a for s in sets for a in ("--set", s)]]
    log = call.work / "runs" / f"{v.name}-encode"
    t0 = time.time()
    rc = run_process(cmd, log.with_suffix(".out"), log.with_suffix(".err"), min(call.plan.timeout_s, call.left()),
                     {**call.env, **v.env})
    rec = {"folder": str(folder), "command": shlex.join(["python3", *cmd[1:]]), "wall_s": round(time.time() - t0, 1),
           "status": "timeout" if rc is None else "ok" if rc == 0 else "failed",
           "summary": log.with_suffix(".out").read_text().strip()[-300:] if log.with_suffix(".out").exists() else ""}
    if rc != 0:
        rec["log_tail"] = tail(log.with_suffix(".out"), log.with_suffix(".err"))
    return rec


# --- processes ----------------------------------------------------------------------------------------

def run_process(cmd: list[str], stdout: Path, stderr: Path, timeout_s: float, env: dict[str, str]) -> int | None:
    """Run `cmd` as its own process group; the whole group is stopped at the limit (None)."""
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env={**os.environ, **env},
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            return None
        except BaseException:  # the caller stopped (Ctrl-C): nothing of the group keeps running
            _stop_group(proc)
            raise


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it after KILL_GRACE_S."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def tail(*paths: Path, lines: int = 40) -> str:
    text = "\n".join(p.read_text(errors="replace") for p in paths if p.exists())
    return "\n".join(text.splitlines()[-lines:])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trial_command(t: Trial) -> str:
    """The trial's child command as text (trainkit.trials builds the same)."""
    env = [f"{k}={shlex.quote(v)}" for k, v in t.env.items() if k != "PYTHONPATH"]
    launch = ["python3", "-m", "trainkit.trials"]
    if t.nproc > 1:
        launch = ["torchrun", "--standalone", f"--nproc-per-node={t.nproc}", "-m", "trainkit.trials"]
    return " ".join([*env, shlex.join([*launch, str(t.config), *[a for s in t.sets() for a in ("--set", s)]])])


# --- the three kinds of item --------------------------------------------------------------------------

def run_probe(call: Call) -> dict[str, Any]:
    p = call.plan.probe
    path = PROBES / p.file
    rec: dict[str, Any] = {"file": str(path.relative_to(ROOT)), "sha256": sha256(path), "args": list(p.args),
                           "compare": p.compare or p.args[0]}
    if call.cpu:
        return {**rec, "status": "skipped", "reason": "--cpu: the probe needs CUDA and NCCL and has no CPU mode"}
    if call.left() < call.plan.min_start_s:
        return {**rec, "status": "skipped", "reason": f"budget: {call.left():.0f} s left"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={call.nproc}",
           str(path), *p.args]
    rec["command"] = shlex.join(["torchrun", *cmd[3:]])
    log = call.work / "probe"
    t0 = time.time()
    rc = run_process(cmd, log.with_suffix(".out"), log.with_suffix(".err"), min(p.timeout_s, call.left()), call.env)
    rec["wall_s"] = round(time.time() - t0, 1)
    rows = []
    for line in log.with_suffix(".out").read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    rec.update(status="timeout" if rc is None else "ok" if rc == 0 else "crash", returncode=rc, rows=rows)
    if rc != 0:
        rec["log_tail"] = tail(log.with_suffix(".out"), log.with_suffix(".err"))
    return rec


def card_held() -> list[dict[str, Any]]:
    """Processes holding GPU memory now (nvidia-smi's compute apps; [] without nvidia-smi): a variant
    should start on an empty card."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return [{"pid": int(pid), "mib": int(mib)} for pid, mib in rows if pid.strip().isdigit() and mib.strip().isdigit()]


def run_variant(call: Call, v: Variant) -> dict[str, Any]:
    plan = call.plan
    config = variant_config(plan, v)
    rec: dict[str, Any] = {"name": v.name, "group": v.group, "note": v.note, "config": config.name,
                           "overrides": list(v.overrides), "env": dict(v.env)}
    if call.cpu:
        rec["cpu_replaced"] = cpu_replaced(plan, v)
    left = call.left()
    if left < plan.min_start_s:
        return {**rec, "status": "skipped", "reason": f"budget: {left:.0f} s left"}
    if not call.cpu and v.if_failed and call.done.get(v.if_failed, {}).get("status") == "ok":
        return {**rec, "status": "skipped", "reason": f"{v.if_failed} finished (if_failed)"}
    sets = variant_sets(plan, v, cpu=call.cpu, shards=call.shards, extra=call.extra)
    if v.init_from:
        try:
            folder = weights_for(call, v, sets)
        except Exception as e:  # noqa: BLE001 - the variant cannot start: its record says why
            return {**rec, "status": "crash", "error": {"kind": "crash", "type": type(e).__name__,
                                                        "message": str(e), "rank": None}}
        sets = variant_sets(plan, v, cpu=call.cpu, shards=call.shards, init_from=folder, extra=call.extra)
        rec["init_from"] = {"checkpoint": folder}
    if v.cached_backbone:  # after init_from: the cache is of the weights the trial loads
        rec["cache"] = cache = backbone_cache(call, v, config, sets)
        if cache["status"] != "ok":
            return {**rec, "status": "crash", "error": {"kind": "crash", "type": "EncodeBackbone",
                                                        "message": cache.get("log_tail", "")[-300:], "rank": None}}
        sets = [f"data.shards={cache['folder']}" if set_key(s) == "data.shards" else s for s in sets]
        left = call.left()
    limit = plan.cpu.timeout_s if call.cpu else (v.timeout_s or plan.timeout_s)
    trial = Trial(config=config, out_dir=call.work / "runs" / v.name, overrides=tuple(sets), nproc=call.nproc,
                  timeout_s=min(limit, left), env={**call.env, **v.env}, name=v.name)
    rec["command"] = trial_command(trial)
    if not call.cpu and (held := card_held()):
        rec["card_held_before"] = held  # an OOM below may be another process's memory, not this variant's
        print(f"{v.name}: the card holds {held} before it starts", file=sys.stderr)
    r = run_trial(trial, replace=True)
    rec.update(status=r.status, error=None if r.error is None else dataclasses.asdict(r.error),
               returncode=r.returncode, wall_s=round(r.wall_s, 1))
    steady = steady_figures(r.intervals, plan.cpu.skip if call.cpu else plan.skip)
    rec.update({k: steady.get(s) for k, s in (("samples_per_s", "samples_per_s_gpu"), ("mfu", "mfu"),
                                              ("peak_mem_gib", "peak_mem_gib"), ("step_time_s", "step_time_s"),
                                              ("data_wait_frac", "data_wait_frac"))})
    rec.update(steady=steady, losses=[r.losses[k] for k in sorted(r.losses)], profile=r.profile)
    if v.init_from:
        rec["init_from"]["load_s"] = r.metric("init_from.seconds")
    if not r.ok:
        rec["log_tail"] = tail(r.log)
    return rec


def steady_figures(intervals: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    from trainkit.observe.summary import steady_state
    return steady_state(intervals, skip) if intervals else {}


def run_command(call: Call, r: Run) -> dict[str, Any]:
    config, overrides, args = run_parts(call.plan, r, cpu=call.cpu)
    rec: dict[str, Any] = {"name": r.name, "group": r.group, "kind": r.kind, "note": r.note}
    if call.left() < call.plan.min_start_s:
        return {**rec, "status": "skipped", "reason": f"budget: {call.left():.0f} s left"}
    folder = call.work / "runs" / r.name
    shutil.rmtree(folder, ignore_errors=True)
    sets = [*([f"data.shards={call.shards}"] if r.kind != "inspect" else []), *overrides, *call.extra]
    cmd = [sys.executable, "-m", "trainkit.cli", r.kind, str(config), *[a for s in sets for a in ("--set", s)]]
    cmd += ["--json"] if r.kind == "inspect" else ["--out", str(folder), "--nproc", str(call.nproc)]
    cmd += list(args)
    rec["command"] = shlex.join(["python3", *cmd[1:]])
    log = call.work / "runs" / r.name
    t0 = time.time()
    limit = min(r.timeout_s, call.left())
    rc = run_process(cmd, log.with_suffix(".out"), log.with_suffix(".err"), limit, call.env)
    rec.update(status="timeout" if rc is None else "ok" if rc == 0 else "failed", returncode=rc,
               wall_s=round(time.time() - t0, 1))
    try:
        if r.kind == "inspect":
            rec["result"] = json.loads(log.with_suffix(".out").read_text())
        else:
            rec["result"] = json.loads((folder / f"{r.kind}.json").read_text())
    except (OSError, ValueError):
        rec["result"] = None
    rec["files"] = []
    for src, dst in RUN_FILES[r.kind].items():
        if (folder / src).exists():
            shutil.copy(folder / src, call.out / dst.format(r.name))
            rec["files"].append(dst.format(r.name))
    if rc != 0:
        rec["log_tail"] = tail(log.with_suffix(".out"), log.with_suffix(".err"))
    return rec


# --- the call -----------------------------------------------------------------------------------------

def select(plan: Plan, only: list[str] | None, cpu: bool) -> set[str]:
    """The items to run: named ones or whole groups with --only, else "main" (a --cpu dry run: all)."""
    items = {v.name: v.group for v in plan.variants} | {r.name: r.group for r in plan.runs}
    if plan.probe:
        items["probe"] = plan.probe.group
    if not only:
        return set(items) if cpu else {n for n, g in items.items() if g == "main"}
    known = set(items) | set(items.values()) | {"all"}
    unknown = [w for w in only if w not in known]
    if unknown:
        raise SystemExit(f"bench/gpu/gpu.py: --only {unknown[0]!r} is no variant, run or group of {plan.path.name} "
                         f"(groups: {', '.join(sorted(set(items.values())))}; names: {', '.join(items)})")
    return {n for n, g in items.items() if "all" in only or n in only or g in only}


def _say(name: str, rec: dict[str, Any]) -> None:
    """One progress line per item (the table comes at the end)."""
    why = rec.get("reason") or (rec.get("error") or {}).get("message", "")
    sps = rec.get("samples_per_s")
    print(f"{name}: {rec['status']}" + (f" {sps:.2f} samples/s" if sps else "")
          + (f" ({why})" if rec["status"] != "ok" else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan", metavar="PLAN.toml|FAMILY", help="a plan file or a family of bench/gpu/plans/")
    p.add_argument("--out", type=Path, required=True, help="folder for <plan>.json and the runs' report files")
    p.add_argument("--only", nargs="+", metavar="NAME", help="variants, runs, groups or 'probe' (default: group main)")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting items after this (default: the plan's)")
    p.add_argument("--nproc", type=int, default=None, help="processes (GPUs) per variant (default: the plan's)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="an override after every variant's and run's own (before the --cpu ones)")
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_gpu"), help="shards, run folders, checkpoints")
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU: every variant at tiny shapes, 3 steps")
    args = p.parse_args(argv)
    t0 = time.time()
    try:
        plan = load_plan(args.plan)
        check_overrides(tuple(args.sets), "--set")
    except PlanError as e:
        raise SystemExit(f"bench/gpu/gpu.py: {e}") from None
    wanted = select(plan, args.only, args.cpu)
    cpu = plan.cpu
    mode, data = ("cpu", cpu.data) if args.cpu else ("gpu", plan.data)
    budget = args.budget_s or (cpu.budget_s if args.cpu else plan.budget_s)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU path even on a GPU machine
    plan_file = plan.path.resolve()
    res: dict[str, Any] = {
        "schema": SCHEMA, "family": plan.family, "title": plan.title, "mode": mode, "baseline": plan.baseline,
        "plan": {"file": str(plan_file.relative_to(ROOT) if plan_file.is_relative_to(ROOT) else plan_file),
                 "sha256": sha256(plan_file)},
        **header(),  # command, commit, dirty, date, machine, card (bench/record.py)
        "settings": {"nproc": 1 if args.cpu else (args.nproc or plan.nproc), "budget_s": budget,
                     **({"steps": cpu.steps, "skip": cpu.skip, "log_every": cpu.log_every, "profile_steps": 0}
                        if args.cpu else {"steps": plan.steps, "skip": plan.skip, "log_every": plan.log_every,
                                          "profile_steps": plan.profile_steps}),
                     "sets": args.sets, "only": args.only, "selected": sorted(wanted)},
        "data": dataclasses.asdict(data), "probe": None, "checkpoints": {}, "variants": [], "runs": [],
    }
    call = Call(plan=plan, out=args.out, work=args.work / f"{plan.path.stem}-{mode}", cpu=args.cpu,
                nproc=res["settings"]["nproc"], budget_end=t0 + budget, res=res, env=env, extra=tuple(args.sets))
    args.out.mkdir(parents=True, exist_ok=True)
    (call.work / "runs").mkdir(parents=True, exist_ok=True)
    t = time.time()
    call.shards = make_shards(args.work, data)
    res["data"].update(shards=str(call.shards), build_s=round(time.time() - t, 1))
    call.dump()
    if plan.probe and "probe" in wanted:
        res["probe"] = run_probe(call)
        _say("probe", res["probe"])
        call.dump()
    for v in plan.variants:
        if v.name in wanted:
            rec = run_variant(call, v)
            rec["compare"] = v.compare or None
            rec["probe_row"] = None if v.cached_backbone else \
                v.probe or (plan.probe.compare or plan.probe.args[0] if plan.probe else None)
            res["variants"].append(rec)
            call.done[v.name] = rec
            _say(v.name, rec)
            call.dump()
    for r in plan.runs:
        if r.name in wanted:
            res["runs"].append(run_command(call, r))
            _say(r.name, res["runs"][-1])
            call.dump()
    res["wall_s"] = round(time.time() - t0, 1)
    call.dump()
    table(res)
    print(f"{args.out / (plan.path.stem + '.json')}  ({res['wall_s']:.0f} s)")
    if not args.cpu:
        return 0  # on the GPU a failed variant is a result (an OOM is a measurement)
    bad = [x["name"] for x in [*res["variants"], *res["runs"]] if x["status"] != "ok"]
    if bad:  # a dry run passes only if every item it was to check ran and finished
        print(f"bench/gpu/gpu.py --cpu: not ok: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

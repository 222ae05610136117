"""The `trainkit` command.

    trainkit configs                                                       # the shipped presets, one line each
    trainkit run CONFIG.toml [--overlay best.toml] [--set key=value ...]   # one process, or under torchrun:
    torchrun --nproc-per-node 2 -m trainkit.cli run CONFIG.toml --set data.shards=out/
    trainkit inspect CONFIG.toml [--overlay best.toml] [--set key=value ...] [--json] [--world-size N] [--gpu-memory-gib G]
                     [--loader-toml FILE] [--samples-per-s N]   # + the run's LoaderConfig and its `datakit plan` line
    trainkit tune CONFIG.toml --memory-cap GiB [--budget-min M] [--set key=value ...] [--out DIR] [--top 3] [--repeats 2]
    trainkit ladder BASELINE.toml [--set key=value ...] [--target OPT.toml] [--rungs a,b] [--steps N] [--out DIR]
    trainkit ladder --list-rungs                                            # the rungs, one line each
    trainkit export RUN_DIR OUT --format lerobot|openpi|isaac|dreamzero|wan|diffusers|peft [--dtype float32|bfloat16] [--weights model|ema] [--force]
                    [--tokenizer-name NAME] [--source NAME]   # --source: a mixture's run, for that one robot
    trainkit predict RUN_DIR|CKPT --shards OUT [--episodes 3,5-7] [--config CONFIG.toml] [--weights model|ema]
                     [--seed S] [--steps N] [--every N] [--batch-size B] [--out DIR]   # open-loop action error
    trainkit encode-backbone CONFIG.toml --out FEATURES [--set key=value ...] [--batch N] [--force]   # gr00t: the
                     frozen backbone cached once; train the head with data.shards=FEATURES (docs/gr00t.md)

CONFIG is a TOML file, or the name of a shipped preset (`trainkit run pi05_tiny`; trainkit/configs/):
a path that exists wins. Bad input (config, shard folder or its index, output.dir, camera mapping,
world size, memory cap) prints one line naming the key or file and the problem, and exits with code
2 before any GPU work.
So do a run that cannot resume (no intact checkpoint, a planted or another run's checkpoint), a
second run into a live output.dir, and a non-finite step under train.on_nonfinite="stop".
`tune` and `ladder` stopped by Ctrl-C or SIGTERM stop their running trial, report what finished
in one line and exit 130 / 143 (trainkit/trials/signals.py). `trainkit run` stopped by SIGTERM or
the first Ctrl-C finishes the step under way, checkpoints it (where the run checkpoints), prints one
line and exits 143 / 130; a second Ctrl-C exits at once (one line, 130).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from trainkit.errors import USER_ERRORS, LaunchError, Stopped


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainkit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("configs", help="the shipped presets a config argument can name, one line each")
    r = sub.add_parser("run", help="train from a TOML config (torchrun for several GPUs / nodes)")
    r.add_argument("config")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. train.steps=100 or parallel.group.vision_blocks=4")
    r.add_argument("--overlay", metavar="TOML", help="a TOML file of config keys applied on top of CONFIG, "
                   "before --set (what `trainkit tune` writes as best.toml); unknown keys are refused")
    i = sub.add_parser("inspect", help="params, tokens, FLOPs, FSDP units, memory estimate (meta device)")
    i.add_argument("config")
    i.add_argument("--overlay", metavar="TOML", help="a TOML file applied on top of CONFIG, before --set")
    i.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.add_argument("--world-size", type=int, default=None, help="GPUs to estimate for (default: WORLD_SIZE or 1)")
    i.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="memory of one GPU to compare the estimate with (default: this machine's GPU, else an H200)")
    i.add_argument("--loader-toml", metavar="FILE", default=None,
                   help="write the run's LoaderConfig (rank 0) as TOML, for `datakit plan SHARDS --loader-config FILE`")
    i.add_argument("--samples-per-s", type=float, default=None, metavar="N",
                   help="the target samples/s (all ranks) to put in the printed `datakit plan` line")
    t = sub.add_parser("tune", help="the fastest settings under a memory cap, by short measured runs, the best repeated")
    t.add_argument("config")
    t.add_argument("--memory-cap", type=float, required=True, metavar="GIB", help="peak memory per GPU allowed")
    t.add_argument("--budget-min", type=float, default=10.0, help="wall-clock minutes for the runs (default 10)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    t.add_argument("--out", default=None, help="new folder for tune.json, best.toml and the runs (default runs/tune-NAME)")
    t.add_argument("--nproc", type=int, default=1, help="GPUs per run (torchrun --standalone for > 1)")
    t.add_argument("--steps", type=int, default=12, help="steps per run (the first quarter is warm-up)")
    t.add_argument("--top", type=int, default=3, help="settings run again, by their first run's speed (default 3)")
    t.add_argument("--repeats", type=int, default=2,
                   help="runs of each top setting, interleaved A B C A B C (default 2; 1: no repeats)")
    t.add_argument("--trial-timeout-s", type=float, default=300.0, help="limit of one run, start-up included")
    t.add_argument("--micro-batches", default=None, help="comma list (default 1,2,4,...,128)")
    t.add_argument("--strides", default=None, help="recompute strides per block list, comma list (default 0,1,2,4)")
    t.add_argument("--groups", default=None, help="blocks per FSDP unit, comma list (default 1,2,4)")
    t.add_argument("--compile", choices=("both", "on", "off"), default="both", help="torch.compile settings tried")
    t.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="what an out-of-memory run had (default: this machine's GPU, else an H200)")
    lad = sub.add_parser("ladder", help="baseline, then each optimisation turned on in turn: step time, MFU, "
                                        "memory, parity (--list-rungs)")
    lad.add_argument("config", nargs="?", help="the baseline config (a TOML file or a preset name)")
    lad.add_argument("--list-rungs", action="store_true", help="print the rungs, one line each, and exit")
    lad.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override for every rung, e.g. data.shards=OUT")
    lad.add_argument("--target", default=None, help="config (file or preset) the family-specific values come "
                     "from (default: the baseline's *optimised* sibling)")
    lad.add_argument("--rungs", default=None, help="comma-separated rungs, in order (default: all; `--list-rungs` lists them)")
    lad.add_argument("--steps", type=int, default=20, help="measured steps per rung (default 20)")
    lad.add_argument("--warmup", type=int, default=10, help="steps before the measured ones (default 10)")
    lad.add_argument("--profile-steps", type=int, default=3, help="torch.profiler window inside the warm-up (0: none)")
    lad.add_argument("--nproc", type=int, default=1, help="processes per rung (torchrun for > 1)")
    lad.add_argument("--rung-timeout", type=float, default=900.0, help="seconds a rung may take (default 900)")
    lad.add_argument("--parity-abs", type=float, default=1e-3, help="mean |loss diff| vs baseline (default 1e-3)")
    lad.add_argument("--parity-rel", type=float, default=0.02, help="mean relative loss diff, FP8 (default 0.02)")
    lad.add_argument("--out", default=None, help="output folder (default runs/ladder-<config name>)")
    e = sub.add_parser("export", help="a run's newest checkpoint as model.safetensors + config.json (LeRobot / openpi)")
    e.add_argument("run_dir")
    e.add_argument("out")
    e.add_argument("--format", required=True, metavar="FORMAT",
                   help="a checkpoint format the run's family declares (its record's weights.formats, e.g. lerobot; "
                        "README.md lists each family's); another is refused naming the family's")
    e.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    e.add_argument("--weights", default="model", choices=("model", "ema"),
                   help="the trained weights, or their EMA (a run with train.ema_decay > 0)")
    e.add_argument("--force", action="store_true",
                   help="replace an existing non-empty OUT whole (removed only once the new export is complete)")
    e.add_argument("--tokenizer-name", default=None, metavar="NAME",
                   help="the tokenizer LeRobot's pipeline loads (default: the run's model.tokenizer, copied to "
                   "OUT/tokenizer and named by that path; e.g. google/paligemma-3b-pt-224 for a Hub upload)")
    e.add_argument("--source", default=None, metavar="NAME",
                   help="a run on a mixture (data.sources): export for this one source (its name, as the run's "
                        "loss/<name> metrics name it): its cameras, state/action sizes and statistics; required "
                        "there, refused for a one-folder run")
    eb = sub.add_parser("encode-backbone", help="a model's frozen backbone run once over data.shards into a feature "
                        "folder its head trains from (data.shards = OUT; removes image augmentation)",
                        description="Run the frozen front of the config's model (the vision-language backbone up to "
                        "select_layer, under the model's deterministic view transform) once over the config's "
                        "data.shards and write a feature folder; then `trainkit run CONFIG --set data.shards=FEATURES` "
                        "trains the head alone from it. The config must train nothing inside the cut, fix the crop "
                        "and pad every prompt to one length: one that doesn't is refused with the settings to change. "
                        "A rerun resumes; `datakit verify FEATURES` checks it (docs/encode.md).")
    eb.add_argument("config", help="the run's TOML config (or a preset name): its model, weights, data.shards and slots")
    eb.add_argument("--out", required=True, metavar="FEATURES", help="the feature folder to write (a rerun resumes)")
    eb.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    eb.add_argument("--batch", type=int, default=8, help="samples per backbone call (part of the fingerprint)")
    eb.add_argument("--force", action="store_true", help="start over: remove what an earlier encode wrote in OUT")
    eb.add_argument("--no-progress", action="store_true", help="no progress bar")
    pr = sub.add_parser("predict", help="open-loop action error of a checkpoint on held-out episodes: table, "
                                        "predict.json, predict.png (trainkit/predict/)")
    pr.add_argument("source", metavar="RUN_DIR|CKPT", help="a run folder, or a checkpoint folder (model.safetensors "
                    "+ config.json: trainkit export, LeRobot, openpi) with --config")
    pr.add_argument("--shards", required=True, help="the datakit shard folder to predict on")
    pr.add_argument("--episodes", default=None, help="episode indices, e.g. 3,5,8-11 (default: the run's "
                    "validation episodes when --shards is its dataset and it held some out, else every episode)")
    pr.add_argument("--config", default=None, help="a checkpoint folder's run config (model.family/preset, data.*)")
    pr.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override on top of --config")
    pr.add_argument("--weights", default="model", choices=("model", "ema"), help="a run's trained weights or their EMA")
    pr.add_argument("--seed", type=int, default=0, help="flow noise seed (a sample's noise: seed and its frame row)")
    pr.add_argument("--steps", type=int, default=None,
                    help="Euler steps (default: the family's, as its reference implementation samples)")
    pr.add_argument("--every", type=int, default=None, help="a chunk every N frames, its first N actions kept "
                    "(default: the action horizon, whole chunks back to back)")
    pr.add_argument("--batch-size", type=int, default=8)
    pr.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    pr.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    pr.add_argument("--out", default=None, help="folder for predict.json and predict.png (default runs/predict-NAME)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "ladder" and args.config is None and not args.list_rungs:
        print("trainkit: ladder: the baseline config is required (or --list-rungs)", file=sys.stderr)
        return 2
    from trainkit.config import load_config
    try:
        if args.command == "configs":
            from trainkit.configs import listing
            print(listing())
            return 0
        if args.command == "ladder" and args.list_rungs:
            from trainkit.trials.ladder import RUNGS, describe_rung
            print("\n".join(describe_rung(r) for r in RUNGS))
            return 0
        if args.command in ("tune", "ladder"):  # a preset name -> its file: what their child runs read
            from trainkit.configs import resolve_config
            args.config_file = resolve_config(args.config)
        if args.command == "tune":
            return _tune(args)
        if args.command == "inspect":
            return _inspect(load_config(args.config, args.overrides, required=False, overlay=args.overlay), args)
        if args.command == "ladder":
            return _ladder(args, argv if argv is not None else sys.argv[1:])
        if args.command == "predict":
            return _predict(args)
        if args.command == "encode-backbone":
            return _encode_backbone(load_config(args.config, args.overrides), args)
        if args.command == "export":
            from trainkit.weights.export import export_run
            path = export_run(args.run_dir, args.out, args.format, args.dtype, args.weights, force=args.force,
                              tokenizer_name=args.tokenizer_name, source=args.source)
            which = f" for source {args.source!r}" if args.source else ""
            print(f"trainkit: exported {path} ({args.weights} weights) as {args.format} ({args.dtype}){which} to {args.out}")
            return 0
        cfg = load_config(args.config, args.overrides, overlay=args.overlay)  # a bad config: one line before torch loads
        from trainkit.train import StopSignals, run
        with StopSignals() as stop:
            run(cfg, stop)
        return 0
    except Stopped as e:  # SIGTERM / Ctrl-C: stopped at a step boundary after its final checkpoint
        print(f"trainkit: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C (or one before the run took over SIGINT)
        print("trainkit: interrupted by Ctrl-C (SIGINT): exited at once, no checkpoint of the step under way "
              "(a rerun resumes from the newest checkpoint in output.dir)", file=sys.stderr)
        return 130
    except USER_ERRORS as e:
        print(f"trainkit: {e}", file=sys.stderr)
        return 2
    finally:
        dist = sys.modules.get("torch.distributed")  # not imported only to find nothing to shut down
        if dist is not None and dist.is_initialized():  # a clean NCCL shutdown under torchrun; no group left behind
            dist.destroy_process_group()


class _Terminated(KeyboardInterrupt):
    """SIGTERM during encode-backbone, handled as Ctrl-C is: the committed shards stay for a rerun."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def _encode_backbone(cfg, args) -> int:
    """The cache, with Ctrl-C and SIGTERM as one line and exit 130 / 143 (a rerun resumes)."""
    from trainkit.predict.encode_backbone import encode_backbone
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        summary = encode_backbone(cfg, Path(args.out), batch=args.batch, force=args.force,
                                  progress=not args.no_progress, command=" ".join(sys.argv))
    except KeyboardInterrupt as e:
        how = "terminated (SIGTERM)" if isinstance(e, _Terminated) else "interrupted by Ctrl-C (SIGINT)"
        print(f"trainkit: encode-backbone {how}: the shards committed in {args.out} stay; rerun the same command "
              f"to resume", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(f"trainkit: {summary.line(Path(args.out))}")
    return 0


def _inspect(cfg, args) -> int:
    from trainkit.estimate.inspect import format_report, inspect_model
    world = args.world_size or int(os.environ.get("WORLD_SIZE", 1))
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise LaunchError(f"--gpu-memory-gib: must be > 0, got {args.gpu_memory_gib:g}")
    gpu = None if args.gpu_memory_gib is None else ("GPU (--gpu-memory-gib)", args.gpu_memory_gib)
    if args.samples_per_s is not None and not args.samples_per_s > 0:
        raise LaunchError(f"--samples-per-s: must be > 0, got {args.samples_per_s:g}")
    from trainkit.estimate.loader import loader_needs, loader_toml
    from trainkit.weights.shape import with_weights_shape
    cfg, fixed = with_weights_shape(cfg)  # the shape the trainer would build from model.init_from
    report = inspect_model(cfg, world_size=world, gpu=gpu)
    if chosen := report["auto_micro_batch"]:  # train.micro_batch = "auto": the loader's batch is the one chosen
        from trainkit.estimate.auto_batch import with_micro_batch
        micro = report["micro_batch"]  # chosen, or the smallest when none fits (chosen["refused"] says so)
        cfg = with_micro_batch(cfg, micro, chosen.get("global_batch") or cfg.train.global_batch or micro * world)
    if fixed:
        report["init_from"] = {"folder": cfg.model.init_from,
                               "fields": {k: {"value": v, "from": where} for k, (v, where) in sorted(fixed.items())}}
    report["loader"], loader = loader_needs(cfg, world, args.samples_per_s, args.loader_toml)
    if args.loader_toml:
        if loader is None:
            why = report["loader"].get("error") or \
                f"{cfg.data.shards} is a feature folder: its loader reads whole samples, no LoaderConfig to write"
            raise LaunchError(f"--loader-toml {args.loader_toml}: {why}")
        try:
            with open(args.loader_toml, "w") as f:
                f.write(loader_toml(cfg, report["loader"], loader))
        except OSError as e:
            raise LaunchError(f"--loader-toml {args.loader_toml}: cannot write ({e.strerror or e})") from None
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def _predict(args) -> int:
    from rich.console import Console

    from trainkit.predict.command import PredictArgs, predict
    from trainkit.predict.report import table

    body, written = predict(PredictArgs(source=args.source, shards=args.shards, episodes=args.episodes, out=args.out,
                                    config=args.config, overrides=args.overrides, weights=args.weights, seed=args.seed,
                                    steps=args.steps, every=args.every, batch_size=args.batch_size,
                                    device=args.device, dtype=args.dtype))
    Console().print(table(body))
    print(f"predict: {', '.join(map(str, written))} ({body['episodes_from']}; statistics from {body['stats_from']})")
    return 0


def _ints(flag: str, text: str | None, default: tuple[int, ...], low: int) -> tuple[int, ...]:
    if text is None:
        return default
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < low:
        raise LaunchError(f"{flag}: a comma list of integers >= {low}, got {text!r}")
    return values


def _tune(args) -> int:
    """`trainkit tune` under stop_on_signals: a SIGINT / SIGTERM stops the running trial, and the
    runs that finished are reported (exit 128 + the signal)."""
    from trainkit.trials.signals import stop_on_signals
    with stop_on_signals():
        return _tune_search(args)


def _tune_search(args) -> int:
    """Search, print the table, write the files."""
    import shlex
    from pathlib import Path

    from trainkit.config import load_config
    from trainkit.models import family
    from trainkit.trials.run import WEEK_S, check_flag
    from trainkit.trials.signals import stop_requested
    from trainkit.trials.tune import GROUPS, MICRO_BATCHES, STRIDES, Space, base_setting, prepare_out, search
    from trainkit.trials.tune_report import next_command, write_outputs

    check_flag("--memory-cap", args.memory_cap)
    check_flag("--budget-min", args.budget_min, high=WEEK_S / 60)
    check_flag("--trial-timeout-s", args.trial_timeout_s, high=WEEK_S)
    if args.gpu_memory_gib is not None:
        check_flag("--gpu-memory-gib", args.gpu_memory_gib)
    if args.nproc < 1 or args.steps < 2:
        raise LaunchError(f"--nproc must be >= 1 and --steps >= 2, got {args.nproc} and {args.steps}")
    if args.top < 1 or args.repeats < 1:
        raise LaunchError(f"--top and --repeats must be >= 1, got {args.top} and {args.repeats}")
    space = Space(micro_batches=_ints("--micro-batches", args.micro_batches, MICRO_BATCHES, 1),
                  strides=_ints("--strides", args.strides, STRIDES, 0), groups=_ints("--groups", args.groups, GROUPS, 1),
                  compile={"both": (False, True), "on": (True,), "off": (False,)}[args.compile])
    from trainkit.weights.shape import with_weights_shape
    cfg = with_weights_shape(load_config(args.config, args.overrides))[0]  # estimates of init_from's model
    from trainkit.estimate.auto_batch import resolve_micro_batch
    cfg = resolve_micro_batch(cfg, args.nproc, ("--memory-cap", args.memory_cap))[0]  # the base setting's micro-batch
    out = Path(args.out or f"runs/tune-{Path(args.config).stem}")
    prepare_out(out)
    command = shlex.join(["trainkit", "tune", args.config, "--memory-cap", f"{args.memory_cap:g}", "--budget-min",
                          f"{args.budget_min:g}", *(a for o in args.overrides for a in ("--set", o))])
    base = base_setting(cfg, list(family(cfg.model.family).model.BLOCK_LISTS))
    result = search(cfg, args.config_file, cap_gib=args.memory_cap, budget_s=60 * args.budget_min, out=out,
                    overrides=tuple(args.overrides), world_size=args.nproc, steps=args.steps,
                    log_every=max(1, args.steps // 4), trial_timeout_s=args.trial_timeout_s, space=space,
                    gpu_gib=args.gpu_memory_gib, base=base, top=args.top, repeats=args.repeats)
    print(write_outputs(result, out, command=command, config=args.config, cap_gib=args.memory_cap,
                        budget_s=60 * args.budget_min, world_size=args.nproc, base=base, overrides=args.overrides))
    stop = stop_requested()
    if stop is not None:
        best = f" and {out / 'best.toml'}" if result.best is not None else ""
        print(f"trainkit: tune stopped by {stop.name}: {len(result.runs)} run(s) finished, reported in "
              f"{out / 'tune.json'}{best}", file=sys.stderr)
        return stop.exit_code
    if result.best is None:
        print(f"no run finished under the cap; every run is in {out / 'tune.json'}")
        return 1
    best = result.best
    low, high = best.spread
    tie = f"; a tie with #{best.rank + 1} (their runs overlap)" if best.tie else ""
    print(f"best: {best.setting.label()}: {best.samples_per_s:.2f} samples/s per GPU (median of {len(best.samples)} "
          f"run(s), {low:.2f}-{high:.2f}){tie} -> {out / 'best.toml'}\n"
          f"  {next_command(args.config, out / 'best.toml', args.overrides, best.setting)}")
    return 0


def _ladder(args, argv: list[str]) -> int:
    """`trainkit ladder` under stop_on_signals: a SIGINT / SIGTERM stops the running rung, and the
    rungs that finished are reported (exit 128 + the signal)."""
    from trainkit.trials.signals import stop_on_signals
    with stop_on_signals():
        return _ladder_climb(args, argv)


def _ladder_climb(args, argv: list[str]) -> int:
    import datetime
    import platform
    import shutil
    from pathlib import Path

    import torch

    from trainkit.configs import resolve_config
    from trainkit.trials.ladder import LadderSpec, default_target, resolve_rungs, run_ladder
    from trainkit.trials.ladder_report import write_report
    from trainkit.trials.signals import stop_requested

    config = args.config_file
    out = Path(args.out) if args.out else Path("runs") / f"ladder-{config.stem}"
    if out.exists() and any(out.iterdir()) and not (out / "ladder.json").exists():
        raise LaunchError(f"--out {out}: exists and holds no earlier ladder (ladder.json); use another folder")
    spec = LadderSpec(config=config, overrides=tuple(args.overrides),
                      target=resolve_config(args.target) if args.target else default_target(config), out=out,
                      warmup=args.warmup, steps=args.steps, profile_steps=args.profile_steps, nproc=args.nproc,
                      rung_timeout_s=args.rung_timeout, parity_abs=args.parity_abs, parity_rel=args.parity_rel)
    rungs = resolve_rungs(args.rungs)
    shutil.rmtree(out / "rungs", ignore_errors=True)  # an earlier ladder's run folders (checked above)
    device = _gpu_name() if torch.cuda.is_available() else f"CPU {platform.machine()}"
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": f"{device}, {os.cpu_count()} cores", "command": "trainkit " + " ".join(argv),
            "torch": torch.__version__, "target": str(spec.target) if spec.target else None}
    results = run_ladder(spec, rungs, echo=lambda line: print(line, file=sys.stderr, flush=True))
    print(write_report(spec, results, info))
    stop = stop_requested()
    if stop is not None:
        done = sum(r.status != "stopped" for r in results)
        print(f"trainkit: ladder stopped by {stop.name}: {done} rung(s) finished, reported in {out / 'ladder.json'} "
              f"and {out / 'ladder.md'}", file=sys.stderr)
        return stop.exit_code
    print(f"\nladder: {out / 'ladder.md'}, {out / 'ladder.json'}", file=sys.stderr)
    return 0


def _gpu_name() -> str:
    """The GPU's name from nvidia-smi: the ladder's own process never opens a CUDA context (its
    memory would be missing from every rung's)."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        out = []
    return f"{len(out)} x {out[0]}" if out else "CUDA GPU"


if __name__ == "__main__":
    sys.exit(main())

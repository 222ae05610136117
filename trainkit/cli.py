"""The `trainkit` command.

    trainkit run CONFIG.toml [--overlay best.toml] [--set key=value ...]   # one process, or under torchrun:
    torchrun --nproc-per-node 2 -m trainkit.cli run CONFIG.toml --set data.shards=out/
    trainkit inspect CONFIG.toml [--overlay best.toml] [--set key=value ...] [--json] [--world-size N] [--gpu-memory-gib G]
    trainkit tune CONFIG.toml --memory-cap GiB [--budget-min M] [--set key=value ...] [--out DIR]   # -> DIR/best.toml

Bad input (config, shard folder or its index, output.dir, camera mapping, world size, memory cap)
prints one line naming the key or file and the problem, and exits with code 2 before any GPU work.
So do a run that cannot resume (no intact checkpoint, a planted or another run's checkpoint), a
second run into a live output.dir, and a non-finite step under train.on_nonfinite="stop".
"""
from __future__ import annotations

import argparse
import json
import sys

from datakit.errors import DatakitError
from trainkit.errors import LaunchError, TrainkitError
from trainkit.models.errors import ModelConfigError, TokenizerError

# a bad preset name or model field, a prompt that cannot be encoded, a datakit error naming its file
# (a garbage index.json, a damaged shard): one line to the user, exit 2 (trainkit/trials.py: "refused")
USER_ERRORS = (TrainkitError, ModelConfigError, TokenizerError, DatakitError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainkit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
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
    t = sub.add_parser("tune", help="the fastest settings under a memory cap, by short measured runs (trainkit/tune.py)")
    t.add_argument("config")
    t.add_argument("--memory-cap", type=float, required=True, metavar="GIB", help="peak memory per GPU allowed")
    t.add_argument("--budget-min", type=float, default=10.0, help="wall-clock minutes for the runs (default 10)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    t.add_argument("--out", default=None, help="new folder for tune.json, best.toml and the runs (default runs/tune-NAME)")
    t.add_argument("--nproc", type=int, default=1, help="GPUs per run (torchrun --standalone for > 1)")
    t.add_argument("--steps", type=int, default=12, help="steps per run (the first quarter is warm-up)")
    t.add_argument("--trial-timeout-s", type=float, default=300.0, help="limit of one run, start-up included")
    t.add_argument("--micro-batches", default=None, help="comma list (default 1,2,4,...,128)")
    t.add_argument("--strides", default=None, help="recompute strides per block list, comma list (default 0,1,2,4)")
    t.add_argument("--groups", default=None, help="blocks per FSDP unit, comma list (default 1,2,4)")
    t.add_argument("--compile", choices=("both", "on", "off"), default="both", help="torch.compile settings tried")
    t.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="what an out-of-memory run had (default: this machine's GPU, else an H200)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trainkit.config import load_config
    try:
        if args.command == "tune":
            from trainkit.tune import main as tune
            return tune(args)
        if args.command == "inspect":
            return _inspect(load_config(args.config, args.overrides, required=False, overlay=args.overlay), args)
        from trainkit.train import run
        run(load_config(args.config, args.overrides, overlay=args.overlay))
        return 0
    except USER_ERRORS as e:
        print(f"trainkit: {e}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist
        if dist.is_initialized():  # a clean NCCL shutdown under torchrun; no group left behind in-process
            dist.destroy_process_group()


def _inspect(cfg, args) -> int:
    import os

    from trainkit.inspect import format_report, inspect_model
    world = args.world_size or int(os.environ.get("WORLD_SIZE", 1))
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise LaunchError(f"--gpu-memory-gib: must be > 0, got {args.gpu_memory_gib:g}")
    gpu = None if args.gpu_memory_gib is None else ("GPU (--gpu-memory-gib)", args.gpu_memory_gib)
    report = inspect_model(cfg, world_size=world, gpu=gpu)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

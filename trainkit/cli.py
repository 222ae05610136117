"""The `trainkit` command.

    trainkit run CONFIG.toml [--set key=value ...]         # one process, or under torchrun:
    torchrun --nproc-per-node 2 -m trainkit.cli run CONFIG.toml --set data.shards=out/
    trainkit inspect CONFIG.toml [--set key=value ...] [--json] [--world-size N] [--gpu-memory-gib G]
    trainkit export RUN_DIR OUT --format lerobot|openpi [--dtype float32|bfloat16] [--weights model|ema]

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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainkit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train from a TOML config (torchrun for several GPUs / nodes)")
    r.add_argument("config")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. train.steps=100 or parallel.group.vision_blocks=4")
    i = sub.add_parser("inspect", help="params, tokens, FLOPs, FSDP units, memory estimate (meta device)")
    i.add_argument("config")
    i.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.add_argument("--world-size", type=int, default=None, help="GPUs to estimate for (default: WORLD_SIZE or 1)")
    i.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="memory of one GPU to compare the estimate with (default: this machine's GPU, else an H200)")
    e = sub.add_parser("export", help="a run's newest checkpoint as model.safetensors + config.json (LeRobot / openpi)")
    e.add_argument("run_dir")
    e.add_argument("out")
    e.add_argument("--format", required=True, choices=("lerobot", "openpi"),
                   help="lerobot: keys prefixed model. (save_pretrained); openpi: lerobot/pi05_base's layout")
    e.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    e.add_argument("--weights", default="model", choices=("model", "ema"),
                   help="the trained weights, or their EMA (a run with train.ema_decay > 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trainkit.config import load_config
    try:
        if args.command == "inspect":
            return _inspect(load_config(args.config, args.overrides, required=False), args)
        if args.command == "export":
            from trainkit.export import export_run
            path = export_run(args.run_dir, args.out, args.format, args.dtype, args.weights)
            print(f"trainkit: exported {path} ({args.weights} weights) as {args.format} ({args.dtype}) to {args.out}")
            return 0
        from trainkit.train import run
        run(load_config(args.config, args.overrides))
        return 0
    # a bad preset name or model field, a prompt that cannot be encoded, a datakit error naming
    # its file (a garbage index.json, a damaged shard) are one line too
    except (TrainkitError, ModelConfigError, TokenizerError, DatakitError) as e:
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

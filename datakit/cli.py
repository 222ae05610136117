"""The `datakit` command: convert, verify, info, doctor, plan, encode, bench-decoders, demo.

Errors in the input print one line naming the file and the problem (exit 2); `--debug` shows
the traceback too.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from datakit.commands.flag_types import byte_size
from datakit.errors import DatakitError, output_error


def add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert LeRobot / DROID episodes into uint8 frame shards",
                       description="Decode every camera of every episode once, into uncompressed uint8 tar "
                                   "shards plus a global index. Rerunning the same command resumes.")
    p.add_argument("src", type=str, help="source dataset folder (LeRobot v2.0/v2.1/v3.0 or raw DROID), fsspec URL "
                                         "(s3://..., hf://datasets/...) or Hugging Face Hub repo id (owner/name)")
    p.add_argument("out", type=str, help="output folder (created; must be empty or a previous run's) or fsspec URL "
                                         "(s3://bucket/prefix)")
    p.add_argument("--config", type=Path, help="TOML file with [convert] options; flags override it")
    p.add_argument("--format", choices=["auto", "lerobot", "droid"], help="source format (default auto)")
    p.add_argument("--decoder", choices=["auto", "pyav", "decord", "torchcodec"],
                   help="video decoder (default auto: the fastest for conversion that reads the codec, from this "
                        "machine's conversion ranking (datakit bench-decoders) or the project's measurements; "
                        "falls back to the next)")
    p.add_argument("--decoder-threads", type=int, help="threads per decoder (default 1; 0 = FFmpeg's choice)")
    p.add_argument("--resize", metavar="HxW", help="resize every camera, antialiased (e.g. 224x224)")
    p.add_argument("--layout", choices=["rgb", "nv12"], help="stored colour layout (default rgb)")
    p.add_argument("--workers", type=int, help="worker processes (default: one per shard, or per episode below "
                                                "the shard, up to the usable cores; more than the cores is clamped)")
    p.add_argument("--shard-size", type=byte_size, help="shard roll-over size, e.g. 1GiB, 256MiB (default 1GiB)")
    p.add_argument("--on-error", choices=["fail", "skip"], help="on a bad episode: stop (default) or skip it")
    p.add_argument("--nonfinite", choices=["reject", "keep"],
                   help="NaN/inf in state/action: a bad episode (default), or keep it, out of the statistics")
    p.add_argument("--camera-threads", "--prefetch", dest="camera_threads", action=argparse.BooleanOptionalAction,
                   default=None, help="decode each camera on its own thread (default: on when --workers is below "
                   "the core count); --prefetch is its old name")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--engine", choices=["local", "ray"],
                   help="local process pool (default) or one Ray task per shard (pip install .[ray])")
    p.add_argument("--ray-address", metavar="ADDR", help="--engine ray: join this Ray cluster (default: start a local one with --workers CPUs)")
    p.add_argument("--force", action="store_true",
                   help="start over: remove an earlier conversion's files from OUT (only datakit's own files)")
    p.add_argument("--json", type=Path, help="also write the summary as JSON to this file")


def run_convert(args) -> int:
    from datakit.convert.config import ConvertConfig
    from datakit.convert import convert
    from datakit.commands.summary import print_summary

    over = dict(format=args.format, decoder=args.decoder, decoder_threads=args.decoder_threads,
                resize=args.resize, layout=args.layout, workers=args.workers, shard_size=args.shard_size,
                on_error=args.on_error, nonfinite=args.nonfinite, camera_threads=args.camera_threads,
                progress=False if args.no_progress else None, engine=args.engine, ray_address=args.ray_address)
    cfg = ConvertConfig.from_toml(args.config, **over) if args.config else \
        ConvertConfig(**{k: v for k, v in over.items() if v is not None})
    s = convert(args.src, args.out, cfg, force=args.force, command=" ".join(["datakit", *sys.argv[1:]]))
    if s.already_complete:
        print(f"{args.out}: already complete (index files match checksums.json, every shard has its size, same "
              f"source and options; `datakit verify` re-hashes the shards); nothing to do")
    elif s.resumed_shards:
        print(f"resumed: kept {s.resumed_shards} complete shard(s) from an earlier run")
    print_summary(s.index, None if s.already_complete else s.seconds,
                  notes=None if s.already_complete else {"decoder": s.decoder_why, "workers": s.workers})
    if args.debug:
        for ep, trace in sorted(s.traces.items()):
            print(f"skipped episode {ep}:\n{trace}", file=sys.stderr)
    if args.json:
        try:
            args.json.write_text(json.dumps({**s.index.info(), "seconds": s.seconds, "decoders": s.decoders,
                                             "decoder_why": s.decoder_why, "workers": s.workers}, indent=1))
        except OSError as e:
            raise output_error(args.json, e) from e
    return 0


def add_verify(sub) -> None:
    p = sub.add_parser("verify", help="re-hash every shard and check every indexed offset",
                       description="Check an output folder (or an s3:// / fsspec URL) against its index: checksums "
                                   "of the index files, every shard's size and sha256, every offset against the tar "
                                   "headers. Exit 0 intact, 1 with each problem named.")
    p.add_argument("out", type=str, help="output folder or URL (a remote root is checked shard by shard)")


def run_verify(args) -> int:
    from datakit.verify import verify

    rep = verify(args.out)
    if rep.ok:
        print(f"{args.out}: OK ({rep.shards} shards, {rep.bytes} bytes, {rep.frames} frames, "
              f"{rep.offsets_checked} offsets checked)")
        return 0
    for p in rep.problems:
        print(p, file=sys.stderr)
    return 1


COMMANDS = {
    "convert": (add_convert, run_convert),
    "verify": (add_verify, run_verify),
}


def _register_optional() -> None:
    """The side commands, in datakit/commands/ (imported here so `datakit --help` lists them)."""
    from datakit.commands import demo, encode, info
    from datakit.commands.doctor.command import add_parser as add_doctor, run as run_doctor
    from datakit.commands.plan.command import add_parser as add_plan, run as run_plan

    COMMANDS["info"] = (info.add_parser, info.run)
    COMMANDS["demo"] = (demo.add_parser, demo.run)
    COMMANDS["doctor"] = (add_doctor, run_doctor)
    COMMANDS["plan"] = (add_plan, run_plan)
    COMMANDS["encode"] = (encode.add_parser, encode.run)
    try:  # bench-decoders needs matplotlib for its plot
        from datakit.commands.bench_decoders.command import add_parser, run
    except ImportError:
        return
    COMMANDS["bench-decoders"] = (add_parser, run)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: stop the workers, keep what was committed, exit non-zero."""


_SIGTERM_SEEN = [False]  # a library between the handler and main (Ray's get) may re-raise a plain KeyboardInterrupt


def _on_sigterm(signum, frame) -> None:
    _SIGTERM_SEEN[0] = True
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    _register_optional()
    parser = argparse.ArgumentParser(prog="datakit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in COMMANDS.values():
        add(sub)
    args = parser.parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    _SIGTERM_SEEN[0] = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return COMMANDS[args.command][1](args)
    except (DatakitError, ValueError, FileNotFoundError) as e:
        if args.debug:
            raise
        print(f"datakit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated) or _SIGTERM_SEEN[0]
        name = "terminated (SIGTERM)" if terminated else "interrupted"
        print(f"datakit {args.command}: {name}; rerun the same command to resume", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())

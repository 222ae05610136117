"""`datakit doctor SRC`: the command-line face of the audit (see `datakit.commands.doctor` for what it checks
and the JSON it writes). `add_parser(sub)` / `run(args)` plug into `datakit.cli`; `main(argv)` runs
it on its own (`python -m datakit.commands.doctor SRC`).

Exit codes: 0 no errors (warnings are printed and go into the JSON, but a dataset convert accepts
passes), 1 errors not `--ignore`d (with `--strict`, for CI gates: warnings too), 2 unusable input
(or a --json file that cannot be written), 130 interrupted.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from datakit.commands.doctor.audit import audit_dataset
from datakit.commands.doctor.report import print_report, write_json
from datakit.errors import DatakitError
from datakit.commands.flag_types import names_of, positive
from datakit.machine import available_cpus
from datakit.sources.checks import FINDING_KINDS, FINDINGS

EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_parser(sub) -> argparse.ArgumentParser:
    """Register `doctor` on the `datakit` subcommand parser."""
    p = sub.add_parser(
        "doctor", help="audit a source dataset (videos, tables, metadata) without converting it",
        description="Decode every frame of every camera and read every table of a LeRobot (v2.0/v2.1/v3.0) or "
                    "raw DROID dataset, and list every defect convert would reject or that would silently hurt "
                    "training, each with its file, episode and frame.",
        epilog="Exit code 0: no errors (warnings only: convert accepts it); 1: errors (--strict: any finding); "
               "2: SRC is not a usable dataset folder.")
    p.add_argument("src", type=Path, nargs="?", help="source dataset folder")
    p.add_argument("--list-checks", action="store_true",
                   help="print every kind of finding the audit reports, its severity and meaning, and exit")
    p.add_argument("--format", choices=["auto", "lerobot", "droid"], default="auto", help="source format (default auto)")
    p.add_argument("--workers", type=positive(int), default=None, help="parallel episode workers (default: all cores)")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE ('-': stdout, "
                                                  "and the table goes to stderr)")
    p.add_argument("--frozen-seconds", type=positive(float), default=2.0,
                   help="report a camera showing identical frames for at least this long (default %(default)s)")
    p.add_argument("--ignore", action="append", default=[], metavar="KIND",
                   type=names_of(FINDING_KINDS, "finding kind"),
                   help="leave findings of this kind out (repeatable or comma list, e.g. blank_camera; the kinds "
                        "are listed by `datakit doctor --list-checks`)")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too, not only on errors (CI gates)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the audit for parsed arguments; print the table (and JSON); return the exit code."""
    if args.list_checks:
        print(list_checks())
        return EXIT_CLEAN
    if args.src is None:
        print("datakit doctor: error: the source dataset folder is required (or --list-checks)", file=sys.stderr)
        return EXIT_UNUSABLE
    workers = args.workers if args.workers is not None else available_cpus()
    ignore = {k for kinds in args.ignore for k in kinds}
    try:
        report = audit_dataset(args.src, fmt=args.format, workers=workers,
                               frozen_seconds=args.frozen_seconds, progress=not args.no_progress)
    except DatakitError as e:
        print(f"datakit doctor: error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        print("datakit doctor: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    report = dataclasses.replace(report, findings=[f for f in report.findings if f.kind not in ignore])
    print_report(report, sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        try:
            write_json(report, args.json)
        except OSError as e:
            print(f"datakit doctor: error: cannot write {args.json}: {e}", file=sys.stderr)
            return EXIT_UNUSABLE
    failing = report.findings if args.strict else [f for f in report.findings if f.severity == "error"]
    return EXIT_FINDINGS if failing else EXIT_CLEAN


def list_checks() -> str:
    """`datakit doctor --list-checks`: one line per kind of finding (datakit.sources.checks.FINDINGS)."""
    width = max(map(len, FINDINGS))
    return "\n".join(f"{kind.ljust(width)}  {severity:<7}  {what}" for kind, (severity, what) in FINDINGS.items())


def main(argv: list[str] | None = None) -> int:
    """`datakit doctor` without the rest of the CLI (tests, `python -m datakit.commands.doctor`)."""
    parser = argparse.ArgumentParser(prog="datakit")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)]))


__all__ = ["EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_UNUSABLE", "add_parser", "list_checks", "main", "run"]

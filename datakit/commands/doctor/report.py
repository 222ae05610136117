"""How a doctor report is shown: a table for people (rich; plain text when not a terminal) and a
strict-JSON document for programs (schema in `datakit.commands.doctor`'s docstring)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from datakit.commands.doctor.audit import SEVERITY_ORDER, DoctorReport
from datakit.durable import write_atomic
from datakit.sources.checks import Finding

SCHEMA = "datakit.doctor/1"


def sorted_findings(findings: list[Finding]) -> list[Finding]:
    """Dataset-wide findings first, then by episode and frame; errors before warnings."""
    return sorted(findings, key=lambda f: (f.episode is not None, f.episode if f.episode is not None else -1,
                                           f.frame if f.frame is not None else -1,
                                           SEVERITY_ORDER.get(f.severity, 2), f.kind, f.path))


def report_dict(report: DoctorReport) -> dict:
    """The JSON document: plain types only, so `json.dumps(allow_nan=False)` accepts it."""
    return {
        "schema": SCHEMA,
        "source": report.source,
        "format": report.format,
        "version": report.version,
        "episodes": report.episodes,
        "frames_decoded": report.frames_decoded,
        "seconds": round(report.seconds, 3),
        "clean": report.clean,
        "errors": sum(f.severity == "error" for f in report.findings),
        "warnings": sum(f.severity == "warning" for f in report.findings),
        "counts": report.counts(),
        "findings": [{"kind": f.kind, "severity": f.severity, "path": f.path, "episode": f.episode,
                      "frame": f.frame, "message": f.message} for f in sorted_findings(report.findings)],
    }


def write_json(report: DoctorReport, dest: str) -> None:
    """`dest` "-" prints to stdout; otherwise the file is written atomically."""
    text = json.dumps(report_dict(report), indent=1, allow_nan=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomic(Path(dest), text.encode())


def _relative(path: str, root: str) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def print_report(report: DoctorReport, file: TextIO | None = None) -> None:
    """A one-line verdict and, when there are findings, a table: severity, kind, episode, frame,
    file (relative to the dataset) and message."""
    from rich.console import Console
    from rich.table import Table

    from datakit.commands.summary import source_label

    console = Console(file=file or sys.stdout, width=200 if not (file or sys.stdout).isatty() else None)
    head = (f"{report.source}: {source_label(report.format, report.version)}, {report.episodes} episodes, "
            f"{report.frames_decoded} frames decoded in {report.seconds:.1f} s")
    if report.clean:
        console.print(f"{head}: no defects found", highlight=False)
        return
    table = Table(title=head, title_justify="left", show_lines=False)
    for col in ("severity", "kind", "episode", "frame", "file", "message"):
        table.add_column(col, overflow="fold")
    for f in sorted_findings(report.findings):
        table.add_row(f.severity, f.kind, "" if f.episode is None else str(f.episode),
                      "" if f.frame is None else str(f.frame), _relative(f.path, report.source), f.message)
    console.print(table, highlight=False)
    d = report_dict(report)
    console.print(f"{d['errors']} error(s), {d['warnings']} warning(s): "
                  + ", ".join(f"{k} {n}" for k, n in d["counts"].items()), highlight=False)


__all__ = ["SCHEMA", "print_report", "report_dict", "sorted_findings", "write_json"]

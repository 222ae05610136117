"""Turning result records into what people read: the live terminal table, the final tables,
and the Markdown summary. All three show the same two views: the main matrix as frames/s per
video x decoder x pattern, and the setting sweeps one row per measurement. Wrong frames and
errors are spelled out in every view, never rendered as a blank cell.
"""
from __future__ import annotations

from typing import Iterable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from datakit.commands.bench_decoders.recommend import Ranking
from datakit.commands.bench_decoders.runner import is_wrong

LIVE_ROWS = 14


def setting_label(r: dict) -> str:
    parts = [f"t={r['threads']}"]
    if r.get("seek_mode"):
        parts.append(r["seek_mode"])
    parts.append("reuse" if r.get("reuse") else "reopen")
    parts.append(f"w={r['workers']}")
    return " ".join(parts)


def cell(r: dict | None) -> str:
    """frames/s, or why there is none; plain text (Markdown and terminal alike)."""
    if r is None:
        return "-"
    if r.get("error"):
        return "unavailable" if r["error"].startswith("unavailable") else "ERROR"
    if is_wrong(r):
        return f"WRONG {r['frames_checked'] - r['frames_correct']}/{r['frames_checked']}"
    return f"{r['frames_per_s']:.0f}" if r.get("frames_per_s") else "?"


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _style(text: str) -> Text:
    if text.startswith("WRONG") or text == "ERROR":
        return Text(text, style="bold red")
    if text == "unavailable":
        return Text(text, style="yellow")
    return Text(text)


def live_view(records: list[dict], done: int, total: int, current: str) -> Group:
    """The table shown while the run goes: progress, then the latest results."""
    t = Table(title=f"bench-decoders  {done}/{total}  now: {current}", title_justify="left", expand=False)
    for c in ("decoder", "video", "pattern", "setting", "f/s", "cpu ms/f", "RSS MB", "1st ms", "check"):
        t.add_column(c, justify="right" if c in ("f/s", "cpu ms/f", "RSS MB", "1st ms") else "left")
    for r in records[-LIVE_ROWS:]:
        status = cell(r) if (r.get("error") or is_wrong(r)) else f"{r['frames_correct']}/{r['frames_checked']} ok"
        t.add_row(r["decoder"], r["video"], r["pattern"], setting_label(r), _style(cell(r)),
                  _num(r.get("cpu_ms_per_frame"), ".2f"), _num(r.get("peak_rss_mb"), ".0f"),
                  _num(r.get("first_frame_ms"), ".0f"), _style(status))
    return Group(t)


def _index(records: Iterable[dict]) -> tuple[list[str], list[str], list[str], dict]:
    main = [r for r in records if r.get("group") == "main"]
    videos = list(dict.fromkeys(r["video"] for r in main))
    decoders = list(dict.fromkeys(r["decoder"] for r in main))
    patterns = list(dict.fromkeys(r["pattern"] for r in main))
    by = {(r["video"], r["decoder"], r["pattern"]): r for r in main}
    return videos, decoders, patterns, by


def main_table(records: list[dict]) -> Table:
    videos, decoders, patterns, by = _index(records)
    t = Table(title="frames/s (1 thread, decoder reused, 1 worker); higher is better", title_justify="left")
    t.add_column("video")
    t.add_column("decoder")
    for p in patterns:
        t.add_column(p, justify="right")
    for v in videos:
        for d in decoders:
            t.add_row(v, d, *[_style(cell(by.get((v, d, p)))) for p in patterns])
    return t


SWEEP_COLS = ("group", "decoder", "video", "pattern", "setting", "f/s", "cpu ms/f", "cpu util", "RSS MB", "1st ms")


def _sweep_row(r: dict) -> list[str]:
    return [r["group"], r["decoder"], r["video"], r["pattern"], setting_label(r), cell(r),
            _num(r.get("cpu_ms_per_frame"), ".2f"), _num(r.get("cpu_util"), ".2f"),
            _num(r.get("peak_rss_mb"), ".0f"), _num(r.get("first_frame_ms"), ".0f")]


def _sweep_records(records: list[dict]) -> list[dict]:
    """Sweep rows, each preceded by the main-matrix record it varies from (the baseline)."""
    sweeps = [r for r in records if r.get("group") != "main"]
    if not sweeps:
        return []
    video = sweeps[0]["video"]
    base = {(r["decoder"], r["pattern"]): r for r in records if r.get("group") == "main" and r["video"] == video}
    out, seen = [], set()
    for r in sorted(sweeps, key=lambda r: (r["group"], r["pattern"], r["decoder"], r["threads"], r["workers"])):
        k = (r["group"], r["decoder"], r["pattern"])
        if k not in seen and (r["decoder"], r["pattern"]) in base:
            out.append({**base[(r["decoder"], r["pattern"])], "group": r["group"] + " (base)"})
            seen.add(k)
        out.append(r)
    return out


def sweep_table(records: list[dict]) -> Table | None:
    rows = _sweep_records(records)
    if not rows:
        return None
    t = Table(title="settings, one varied at a time", title_justify="left")
    for c in SWEEP_COLS:
        t.add_column(c, justify="right" if c in SWEEP_COLS[5:] else "left")
    for r in rows:
        row = _sweep_row(r)
        t.add_row(*row[:5], _style(row[5]), *row[6:])
    return t


def problems(records: list[dict]) -> list[str]:
    out = []
    for r in records:
        where = f"{r['decoder']} {r['video']} {r['pattern']} [{setting_label(r)}]"
        if r.get("error"):
            out.append(f"{where}: {r['error']}")
        elif is_wrong(r):
            out.append(f"WRONG FRAMES {where}: {r['frames_checked'] - r['frames_correct']} of "
                       f"{r['frames_checked']} (asked, got): {r['wrong_examples']}")
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(records: list[dict], rankings: list[Ranking], machine: dict, command: str,
             crosscheck: list[dict], partial: bool = False, backends: dict | None = None) -> str:
    videos, decoders, patterns, by = _index(records)
    out = ["# bench-decoders", "", f"- command: `{command}`"]
    for name, b in (backends or {}).items():
        out.append(f"- {name}: " + (b["version"] if b.get("version") else f"unavailable ({b.get('error')})"))
    if partial:
        out.append(f"- PARTIAL: the run stopped after {len(records)} measurements; what is below is what it made")
    out += [f"- {k}: {v}" for k, v in machine.items()]
    out += ["", "## Recommendation (used by `datakit convert --decoder auto`)", ""]
    out += [f"- {r.line()}" for r in rankings]
    out += ["", "## Frames/s, main matrix (1 thread, decoder reused, 1 worker)", ""]
    out.append(_md_table(["video", "decoder", *patterns],
                         [[v, d, *[cell(by.get((v, d, p))) for p in patterns]] for v in videos for d in decoders]))
    out += ["", "## CPU ms per frame / peak RSS MB / time to first frame ms, main matrix", ""]
    rows = []
    for v in videos:
        for d in decoders:
            rs = [by.get((v, d, p)) for p in patterns]
            rows.append([v, d, *["-" if r is None or r.get("error") else
                                 f"{_num(r['cpu_ms_per_frame'], '.2f')} / {_num(r['peak_rss_mb'], '.0f')} / "
                                 f"{_num(r['first_frame_ms'], '.0f')}" for r in rs]])
    out.append(_md_table(["video", "decoder", *patterns], rows))
    sweep = _sweep_records(records)
    if sweep:
        out += ["", "## Settings, one varied at a time", ""]
        out.append(_md_table(list(SWEEP_COLS), [_sweep_row(r) for r in sweep]))
    if crosscheck:
        out += ["", "## Backends compared with each other (PSNR of the same frames)", ""]
        out.append(_md_table(["video", "decoder", "against", "min PSNR dB"],
                             [[c["video"], c["decoder"], c["reference"],
                               "identical" if c["identical"] else _num(c["psnr_db"], ".1f")] for c in crosscheck]))
    probs = problems(records)
    out += ["", "## Errors and wrong frames", ""]
    out += [f"- {p}" for p in probs] or ["- none"]
    return "\n".join(out) + "\n"

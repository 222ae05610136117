"""What `trainkit tune` (trainkit/trials/tune.py) shows and writes: the ranked table (one row per
setting: the median samples/s of its runs, their spread, ties marked), tune.json and best.toml, the
overlay `trainkit run CONFIG --overlay best.toml` reads, with the measurement beside it as comments,
and `next_command`, the `trainkit run` line printed and written into best.toml. Both files are
written whole or not at all (temporary name, rename); tune.json is strict JSON (a non-finite number
is null) and lists every run, repeats included; a search stopped by a signal writes the runs that
finished and names the signal ("stopped")."""
from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from datakit.durable import write_atomic
from trainkit.estimate.inspect import gpu_memory
from datakit.toml_values import toml_value
from trainkit.trials.run import json_text
from trainkit.trials.tune import Measured, Setting, TuneResult


def _gib(v: float | None) -> str:
    """GiB to one decimal, MiB where that rounds to zero (tiny presets)."""
    if v is None:
        return "-"
    return f"{v:.1f} GiB" if abs(v) >= 0.05 else f"{v * 1024:.2f} MiB"


def _speed(m: Measured) -> tuple[str, str]:
    """The samples/s and spread cells: the median, and the min-max of the runs that measured one."""
    if m.samples_per_s is None:
        return "-", "-"
    low, high = m.spread
    return f"{m.samples_per_s:.2f}", f"{low:.2f}-{high:.2f}" if len(m.samples) > 1 else "-"


def format_table(result: TuneResult, cap_gib: float, base: Setting | None = None) -> str:
    """The ranked table for the terminal, one row per setting (the median samples/s of its runs,
    their min-max); the config's own setting (`base`), the reference run (it, under the cap) and
    ties are marked."""
    rows = [("#", "status", "samples/s/GPU", "spread", "runs", "peak", "estimate", "setting")]
    for m in result.ranked:
        mark = ("  (= CONFIG)" if base is not None and m.setting == base else
                "  (CONFIG's setting under the cap)" if m.setting == result.reference else "")
        tie = f"  (tie with #{m.rank + 1}: the runs overlap)" if m.tie else ""
        rows.append((str(m.rank), m.status, *_speed(m), str(len(m.runs)), _gib(m.peak_gib),
                     _gib(m.runs[0].estimate_gib), m.setting.label() + mark + tie + (f"  [{m.error}]" if m.error else "")))
    width = [max(len(row[k]) for row in rows) for k in range(7)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:7], width)) + "  " + row[7] for row in rows]
    how = (f"estimate's micro-batch part x {result.scale:.3f}, from the measured peaks" if result.calibrated else
           "estimate uncalibrated: no run measured a peak (no CUDA)")
    repeats = sum(r.repeat > 0 for r in result.runs)
    lines.append(f"{len(result.runs)} run(s) ({repeats} repeat(s)) of {result.settings} settings; "
                 f"{result.never_run_over_cap} never run: estimated above the {cap_gib:g} GiB cap ({how})")
    lines += result.late
    if result.stopped:
        lines.append(f"stopped by {result.stopped}: the run in progress was stopped and is not listed")
    return "\n".join(lines)


def _replaced(key: str, keys: Iterable[str]) -> bool:
    """Whether best.toml sets `key` (or the table holding it, as parallel.group.vision_blocks)."""
    return any(key == k or key.startswith(k + ".") for k in keys)


def next_command(config: str | Path, best_toml: Path, overrides: Sequence[str], best: Setting) -> str:
    """The `trainkit run` line for the best setting: CONFIG as given, best.toml, and every --set tune
    was given but those best.toml replaces (tune's runs applied the overlay after the --set, and
    `trainkit run` applies --set after the overlay, so a kept one would undo the best setting)."""
    keep = [o for o in overrides if not _replaced(o.partition("=")[0].strip(), best.overlay())]
    return shlex.join(["trainkit", "run", str(config), "--overlay", str(best_toml),
                       *[a for o in keep for a in ("--set", o)]])


def overlay_toml(best: Measured, header: list[str]) -> str:
    """best.toml: the best setting as sections `trainkit run --overlay` reads, the measurement beside it."""
    sections: dict[str, list[str]] = {}
    for dotted, value in best.setting.overlay().items():
        section, key = dotted.split(".", 1)
        sections.setdefault(section, []).append(f"{key} = {toml_value(value)}")
    peak = "n/a (no CUDA)" if best.peak_gib is None else _gib(best.peak_gib)
    low, high = best.spread
    measured = (f"# measured: {best.samples_per_s:.2f} samples/s per GPU (median of {len(best.samples)} run(s), "
                f"{low:.2f}-{high:.2f}), peak memory (allocated) {peak}, estimate {_gib(best.runs[0].estimate_gib)}")
    lines = [*(f"# {h}" for h in header), measured]
    if best.tie:
        lines.append(f"# a tie with #{best.rank + 1} of tune.json's ranked settings: their runs overlap")
    for section, keys in sections.items():
        lines += ["", f"[{section}]", *keys]
    return "\n".join(lines) + "\n"


def write_outputs(result: TuneResult, out: Path, *, command: str, config: str | Path, cap_gib: float, budget_s: float,
                  world_size: int, base: Setting | None, overrides: Sequence[str] = ()) -> str:
    """tune.json and best.toml under `out`; returns the table printed."""
    text = format_table(result, cap_gib, base)
    doc = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "gpu": gpu_memory()[0] if torch.cuda.is_available() else None, "world_size": world_size,
           "memory_cap_gib": cap_gib, "budget_s": budget_s, "settings": result.settings,
           "never_run_over_cap": result.never_run_over_cap, "memory_scale": round(result.scale, 4),
           "memory_calibrated": result.calibrated,
           "reference": None if result.reference is None else result.reference.overlay(),
           "runs": [r.to_dict() for r in result.runs],
           "ranked": [m.to_dict() for m in result.ranked],
           "best": None if result.best is None else result.best.to_dict(), "stopped": result.stopped,
           "late": result.late,
           "next_command": None if result.best is None else
           next_command(config, out / "best.toml", overrides, result.best.setting)}
    write_atomic(out / "tune.json", json_text(doc).encode())
    if result.best is not None:
        header = [command, doc["next_command"]]
        write_atomic(out / "best.toml", overlay_toml(result.best, header).encode())
    return text

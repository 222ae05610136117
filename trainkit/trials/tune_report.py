"""What `trainkit tune` (trainkit/trials/tune.py) shows and writes: the ranked table, tune.json and
best.toml, the overlay `trainkit run CONFIG --overlay best.toml` reads, with the measured samples/s
and peak memory beside it as comments. Both are written whole or not at all (temporary name, rename);
tune.json is strict JSON (a non-finite number is null); a search stopped by a signal writes the runs
that finished and names the signal ("stopped")."""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from datakit.durable import write_atomic
from trainkit.estimate.inspect import gpu_memory
from datakit.toml_values import toml_value
from trainkit.trials.run import json_text
from trainkit.trials.tune import Run, Setting, TuneResult


def ranked(runs: list[Run]) -> list[Run]:
    """Measured runs fastest first, then runs over the cap, then failures in run order."""
    order = {"ok": 0, "over_cap": 1}
    speed = {id(r): r.samples_per_s if r.samples_per_s is not None and math.isfinite(r.samples_per_s) else 0.0
             for r in runs}  # nan would leave the order undefined
    return sorted(runs, key=lambda r: (order.get(r.status, 2), -speed[id(r)]))


def _gib(v: float | None) -> str:
    """GiB to one decimal, MiB where that rounds to zero (tiny presets)."""
    if v is None:
        return "-"
    return f"{v:.1f} GiB" if abs(v) >= 0.05 else f"{v * 1024:.2f} MiB"


def format_table(result: TuneResult, cap_gib: float, base: Setting | None = None) -> str:
    """The ranked table for the terminal; the config's own setting (`base`) and the reference run
    (it, under the cap) are marked."""
    rows = [("#", "status", "samples/s/GPU", "peak", "estimate", "setting")]
    for i, r in enumerate(ranked(result.runs), 1):
        mark = ("  (= CONFIG)" if base is not None and r.setting == base else
                "  (CONFIG's setting under the cap)" if r.setting == result.reference else "")
        rows.append((str(i), r.status, "-" if r.samples_per_s is None else f"{r.samples_per_s:.2f}",
                     _gib(r.peak_gib), _gib(r.estimate_gib), r.setting.label() + mark + (f"  [{r.error}]" if r.error else "")))
    width = [max(len(row[k]) for row in rows) for k in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:5], width)) + "  " + row[5] for row in rows]
    how = (f"estimate's micro-batch part x {result.scale:.3f}, from the measured peaks" if result.calibrated else
           "estimate uncalibrated: no run measured a peak (no CUDA)")
    lines.append(f"{len(result.runs)} run(s) of {result.settings} settings; {result.never_run_over_cap} never run: "
                 f"estimated above the {cap_gib:g} GiB cap ({how})")
    if result.stopped:
        lines.append(f"stopped by {result.stopped}: the run in progress was stopped and is not listed")
    return "\n".join(lines)


def overlay_toml(best: Run, header: list[str]) -> str:
    """best.toml: the best setting as sections `trainkit run --overlay` reads, the measurement beside it."""
    sections: dict[str, list[str]] = {}
    for dotted, value in best.setting.overlay().items():
        section, key = dotted.split(".", 1)
        sections.setdefault(section, []).append(f"{key} = {toml_value(value)}")
    peak = "n/a (no CUDA)" if best.peak_gib is None else _gib(best.peak_gib)
    lines = [*(f"# {h}" for h in header), f"# measured: {best.samples_per_s:.2f} samples/s per GPU, peak memory "
             f"(allocated) {peak}, estimate {_gib(best.estimate_gib)}"]
    for section, keys in sections.items():
        lines += ["", f"[{section}]", *keys]
    return "\n".join(lines) + "\n"


def write_outputs(result: TuneResult, out: Path, *, command: str, config: str | Path, cap_gib: float, budget_s: float,
                  world_size: int, base: Setting | None) -> str:
    """tune.json and best.toml under `out`; returns the table printed."""
    text = format_table(result, cap_gib, base)
    doc = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "gpu": gpu_memory()[0] if torch.cuda.is_available() else None, "world_size": world_size,
           "memory_cap_gib": cap_gib, "budget_s": budget_s, "settings": result.settings,
           "never_run_over_cap": result.never_run_over_cap, "memory_scale": round(result.scale, 4),
           "memory_calibrated": result.calibrated,
           "reference": None if result.reference is None else result.reference.overlay(),
           "runs": [r.to_dict() for r in ranked(result.runs)],
           "best": None if result.best is None else result.best.to_dict(), "stopped": result.stopped}
    write_atomic(out / "tune.json", json_text(doc).encode())
    if result.best is not None:
        header = [command, f"trainkit run {config} --overlay {out / 'best.toml'}"]
        write_atomic(out / "best.toml", overlay_toml(result.best, header).encode())
    return text

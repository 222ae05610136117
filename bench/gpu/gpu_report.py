"""The report of a bench/gpu/gpu.py call: each variant's ratios (against the plan's baseline, its probe
row and the variant it compares with, losses step by step included) and the table on the terminal.

    python3 bench/gpu/gpu_report.py $OUT/pi05.json        # the table of a saved result again

Ratios are samples/s per GPU over the baseline's, over the probe row's (`samples_s_gpu`) and over
the compared variant's; loss differences are taken over the steps both runs have. A variant trained
from a cached backbone (`cache` in its record) has none: its step is the head alone.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def loss_diff(a: list[float], b: list[float]) -> dict[str, Any] | None:
    n = min(len(a), len(b))
    if not n:
        return None
    d = [abs(x - y) for x, y in zip(a[:n], b[:n])]
    return {"steps": n, "max_abs": max(d), "mean_abs": sum(d) / n,
            "mean_rel": sum(x / abs(y) for x, y in zip(d, b) if y) / n}


def derive(res: dict[str, Any]) -> None:
    """Each variant's ratios against the baseline, its probe row and its compared variant."""
    by_name = {v["name"]: v for v in res["variants"]}
    base = by_name.get(res["baseline"], {}).get("samples_per_s")
    probe = res.get("probe") or {}
    rows = {row.get("variant"): row for row in probe.get("rows", [])}
    for v in res["variants"]:
        sps = v.get("samples_per_s")
        if v.get("cache") is not None:  # the head alone on a cached backbone: reported apart, in no ratio
            v["vs_baseline"] = v["vs_probe"] = v["vs"] = None
            continue
        v["vs_baseline"] = ratio(sps, base)
        row = v.get("probe_row")
        v["vs_probe"] = {"row": row, "ratio": ratio(sps, rows.get(row, {}).get("samples_s_gpu"))} if row else None
        other = by_name.get(v.get("compare") or "")
        v["vs"] = None if other is None else {
            "variant": other["name"], "samples_per_s_ratio": ratio(sps, other.get("samples_per_s")),
            "loss": loss_diff(v.get("losses") or [], other.get("losses") or [])}


def _num(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "" if x is None else format(x * scale, fmt)


def run_summary(r: dict[str, Any]) -> str:
    """One line of a ladder / tune / inspect result for the table."""
    out, head = r.get("result") or {}, f"{r['kind']}, {r.get('wall_s', 0):.0f} s"
    if r.get("reason"):
        return f"{head}: {r['reason']}"
    if r["kind"] == "ladder" and out.get("rungs"):
        ok = [x for x in out["rungs"] if x["status"] == "ok"]
        gain = ok[-1].get("gain_base") if ok else None
        return f"{head}: {len(ok)}/{len(out['rungs'])} rungs ok" + (f", {ok[-1]['name']} x{gain:.3f} baseline" if gain else "")
    if r["kind"] == "tune" and out.get("best"):
        return f"{head}: best {out['best']['label']}, {out['best']['samples_per_s']:.2f} samples/s"
    if r["kind"] == "inspect" and out.get("memory"):
        m = out["memory"]
        return f"{head}: {out.get('world_size')} GPU(s), peak {m['peak_gib']:.1f} GiB estimated"
    return head


def table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res['title']} ({res['mode']}): {res['plan']['file']}", title_justify="left")
    for col in ("variant", "group", "status", "ms/step", "samples/s/GPU", "MFU %", "peak GiB", "wait %",
                "x baseline", "x probe", "note"):
        t.add_column(col, justify="left" if col in ("variant", "group", "status", "note") else "right")
    probe = res.get("probe") or {}
    for row in probe.get("rows", []):
        t.add_row(f"probe {row.get('variant')}", "probe", row.get("error") or "ok", _num(row.get("step_s"), ".0f", 1e3),
                  _num(row.get("samples_s_gpu"), ".2f"), _num(row.get("mfu_pct"), ".1f"), _num(row.get("peak_gib"), ".1f"),
                  "", "", "", "")
    if probe.get("status") not in (None, "ok"):
        t.add_row("probe", "probe", probe["status"], *[""] * 7, probe.get("reason") or probe.get("log_tail", "")[-80:])
    for v in res["variants"]:
        if v["status"] != "ok":
            note = v.get("reason") or (v.get("error") or {}).get("message", "")
        elif v.get("cache") is not None:
            note = f"head alone on a cached backbone (encoded in {v['cache'].get('wall_s')} s): apart, no ratio"
        elif v.get("vs") and v["vs"].get("loss"):
            note = f"vs {v['vs']['variant']}: max |dloss| {v['vs']['loss']['max_abs']:.1e}"
        else:
            note = "profiled" if v.get("profile") else ""
        t.add_row(v["name"], v["group"], v["status"], _num(v.get("step_time_s"), ".0f", 1e3),
                  _num(v.get("samples_per_s"), ".2f"), _num(v.get("mfu"), ".1f", 100), _num(v.get("peak_mem_gib"), ".1f"),
                  _num(v.get("data_wait_frac"), ".2f", 100), _num(v.get("vs_baseline"), ".3f"),
                  _num((v.get("vs_probe") or {}).get("ratio"), ".3f"), note[:90])
    for r in res["runs"]:
        t.add_row(r["name"], r["group"], r["status"], *[""] * 7, run_summary(r)[:90])
    Console(width=200).print(t)


if __name__ == "__main__":
    table(json.loads(Path(sys.argv[1]).read_text()))

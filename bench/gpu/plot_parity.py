"""Loss parity plot from a bench/gpu/gpu.py result: the variants of one group (default "parity") that
compare their losses with another variant (`compare` in the plan), over the same steps, and their
difference from it.

    python3 bench/gpu/plot_parity.py $OUT/pi05.json bench/results/pi05_parity.png [--group parity]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: Path, dst: Path, group: str) -> None:
    res = json.loads(src.read_text())
    by_name = {v["name"]: v for v in res["variants"]}
    runs = [v for v in res["variants"] if v["group"] == group and v.get("compare") in by_name and v.get("losses")]
    if not runs:
        raise SystemExit(f"{src}: no variant of group {group!r} with losses compares with another")
    ref = by_name[runs[0]["compare"]]
    base = ref["losses"]
    fig, (top, bot) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    top.plot(base, label=ref["name"], lw=1.2, color="black")
    for r in runs:
        losses, loss = r["losses"], (r.get("vs") or {}).get("loss") or {}
        n = min(len(base), len(losses))
        label = (f"{r['name']} (mean |diff| {loss.get('mean_abs', float('nan')):.1e}, "
                 f"rel {100 * loss.get('mean_rel', float('nan')):.2f}%)")
        top.plot(losses, label=label, lw=0.9, alpha=0.8)
        bot.plot([a - b for a, b in zip(losses[:n], base[:n])], lw=0.8, label=r["name"])
    top.set_ylabel("loss")
    top.set_title(f"{res.get('title', res['family'])}: loss parity over {len(base)} steps (same batches)")
    top.legend(fontsize=8)
    bot.axhline(0, color="black", lw=0.5)
    bot.set_ylabel(f"variant - {ref['name']}")
    bot.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="bench/gpu/gpu.py's <plan>.json")
    p.add_argument("dst", type=Path, help="the PNG")
    p.add_argument("--group", default="parity")
    a = p.parse_args()
    main(a.src, a.dst, a.group)

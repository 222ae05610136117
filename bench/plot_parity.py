"""Loss parity plot from a bench_trainkit_gpu.py --parity result: baseline and each variant over the
same steps, and their difference.

    python3 bench/plot_parity.py bench/results/trainkit_gpu_kern_parity.json bench/results/pi05_parity.png
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: Path, dst: Path) -> None:
    par = json.loads(src.read_text())["parity"]
    runs = {r["variant"]: r for r in par["runs"]}
    base = runs.pop("parity_baseline")["losses"]
    fig, (top, bot) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    top.plot(base, label="baseline", lw=1.2, color="black")
    for name, r in runs.items():
        losses = r.get("losses", [])
        n = min(len(base), len(losses))
        p = r.get("parity", {})
        label = f"{name[7:]} (mean |diff| {p.get('mean_abs_diff', float('nan')):.1e}, rel {100 * p.get('mean_rel_diff', float('nan')):.2f}%)"
        top.plot(losses, label=label, lw=0.9, alpha=0.8)
        bot.plot([a - b for a, b in zip(losses[:n], base[:n])], lw=0.8, label=name[7:])
    top.set_ylabel("loss")
    top.set_title(f"Pi0.5 full, one H200: loss parity over {par['steps']} steps (micro-batch {par['micro_batch']}, same batches)")
    top.legend(fontsize=8)
    bot.axhline(0, color="black", lw=0.5)
    bot.set_ylabel("variant - baseline")
    bot.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

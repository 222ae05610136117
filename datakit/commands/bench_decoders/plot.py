"""The PNG summary (`--plot FILE`): one panel per access pattern with frames/s per video and
decoder (log scale: sequential and single-frame reads differ by 100x), plus the worker sweep
as throughput and CPU use against the number of processes. Matplotlib's Agg backend, so it
works on headless machines; small DPI keeps the file well under a few hundred KB.
"""
from __future__ import annotations

from pathlib import Path

from datakit.commands.bench_decoders.runner import is_wrong


def _ok(r: dict) -> bool:
    return not r.get("error") and not is_wrong(r) and bool(r.get("frames_per_s"))


def plot(records: list[dict], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = [r for r in records if r.get("group") == "main"]
    patterns = list(dict.fromkeys(r["pattern"] for r in main))
    videos = list(dict.fromkeys(r["video"] for r in main))
    decoders = list(dict.fromkeys(r["decoder"] for r in main))
    sweep = [r for r in records if r.get("group") in ("workers",)]
    n_panels = len(patterns) + (1 if sweep else 0)
    cols = min(3, max(1, n_panels))
    rows = (n_panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False, layout="constrained")
    width = 0.8 / max(1, len(decoders))
    by = {(r["video"], r["decoder"], r["pattern"]): r for r in main}
    for ax, p in zip(axes.flat, patterns):
        for k, d in enumerate(decoders):
            xs, ys, bad = [], [], []
            for i, v in enumerate(videos):
                r = by.get((v, d, p))
                if r is not None and _ok(r):
                    xs.append(i + k * width)
                    ys.append(r["frames_per_s"])
                elif r is not None:
                    bad.append(i + k * width)
            if xs:  # a backend with no result gets no legend entry, only its red x marks
                ax.bar(xs, ys, width, label=d.split(":")[-1][:20], color=f"C{k}")
            for x in bad:  # a failed or wrong measurement is marked, not left as a gap
                ax.text(x, 0.02, "x", ha="center", va="bottom", color="red", fontsize=9,
                        transform=ax.get_xaxis_transform())  # x in data, y in axes fraction
        ax.set_yscale("log")
        ax.set_title(p, fontsize=10)
        ax.set_xticks([i + width * (len(decoders) - 1) / 2 for i in range(len(videos))])
        ax.set_xticklabels([v.replace("-", "\n", 2) for v in videos], fontsize=6)
        ax.set_ylabel("frames/s", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if sweep:
        ax = axes.flat[len(patterns)]
        video = sweep[0]["video"]
        base = [r for r in main if r["video"] == video and r["pattern"] == "clip"]
        for d in decoders:
            pts = sorted((r["workers"], r) for r in base + sweep if r["decoder"] == d and _ok(r))
            if pts:
                ax.plot([w for w, _ in pts], [r["frames_per_s"] for _, r in pts], marker="o", label=f"{d} f/s")
        ax.set_xlabel("worker processes (clip, 1 thread each)", fontsize=8)
        ax.set_ylabel("frames/s (all workers)", fontsize=8)
        ax.set_title(f"worker sweep: {video}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path

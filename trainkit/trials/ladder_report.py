"""The ladder's outputs: a terminal table, ladder.json, ladder.md, a step-time waterfall and a loss overlay.

    write_report(spec, results, info)   # into spec.out; returns the table printed on the terminal

The waterfall plots time per sample per GPU (1 / samples/s), which is the step time at a fixed
micro-batch and stays comparable when a rung changes the micro-batch; each bar floats from the
previous rung's value to its own (green faster, red slower), labelled with the step time. The loss
overlay is baseline's losses and the last rung that ran, over the same steps. The PNGs need
matplotlib (a dependency of the project's dev tools); without it they are left out and the
Markdown says so. ladder.json and ladder.md are written whole or not at all; ladder.json is strict
JSON (a non-finite number, a diverged loss, is null).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from datakit.durable import write_atomic
from trainkit.trials.ladder import LadderSpec, RungResult
from trainkit.trials.run import json_text

WATERFALL, LOSSES = "ladder_waterfall.png", "ladder_losses.png"
HEAD = ("#", "rung", "status", "step ms", "samples/s/GPU", "MFU", "peak GiB", "exp. comm ms", "idle ms",
        "data wait ms", "vs prev", "vs baseline", "parity vs baseline")


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def rows(results: list[RungResult]) -> list[tuple[str, ...]]:
    """One row of HEAD per rung."""
    out = []
    for i, r in enumerate(results):
        m = r.measured
        if m is None:
            why = r.error.kind + ": " + r.error.message if r.error else r.reason
            out.append((str(i), r.name, r.status, *[""] * (len(HEAD) - 4), why))
            continue
        out.append((str(i), r.name, r.status, f"{m.step_time_s * 1e3:.1f}", f"{m.samples_per_s_gpu:.2f}",
                    "n/a" if m.mfu is None else f"{100 * m.mfu:.1f}%", _f(m.peak_mem_gib, ".1f"),
                    _f(m.exposed_comm_ms, ".1f"), _f(m.idle_ms, ".1f"), f"{m.data_wait_ms:.1f}",
                    _gain(r.gain_prev, r.noise_prev), "" if not i else _gain(r.gain_base, r.noise_base),
                    _parity_text(r.parity)))
    return out


def _gain(ratio: float | None, noise: bool) -> str:
    """x1.023, or "x1.023 (noise)" when the two rungs' interval speeds overlap (ladder.compare)."""
    return "" if ratio is None else f"x{ratio:.3f}" + (" (noise)" if noise else "")


def _parity_text(par: dict[str, Any] | None) -> str:
    if par is None:
        return ""
    if par["ok"] is None:
        return f"n/a ({par['why']})"
    return f"{'ok' if par['ok'] else 'BROKEN'} {par['value']:.1e} {'<=' if par['ok'] else '>'} {par['tolerance']:g}"


def table(results: list[RungResult]) -> str:
    """The aligned terminal table."""
    body = rows(results)
    widths = [max(len(HEAD[c]), *(len(r[c]) for r in body)) for c in range(len(HEAD) - 1)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    return "\n".join(fmt.format(*line) for line in [HEAD, *body])


def to_json(spec: LadderSpec, results: list[RungResult], info: dict[str, Any]) -> dict[str, Any]:
    def rung(r: RungResult) -> dict[str, Any]:
        d = dataclasses.asdict(r)
        d["losses"] = {str(k): v for k, v in sorted(r.losses.items())}
        return d

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(spec).items()}
    return {"info": info, "settings": {**settings, "overrides": list(spec.overrides)}, "rungs": [rung(r) for r in results]}


def markdown(spec: LadderSpec, results: list[RungResult], info: dict[str, Any], plots: list[str]) -> str:
    body = rows(results)
    lines = [f"# trainkit ladder: {spec.config.name}", "",
             f"{info.get('date', '')}, {info.get('device', '')}; `{info.get('command', '')}`", "",
             f"Each rung is one `trainkit run` in its own process from the same seed and data: {spec.warmup} warm-up "
             f"steps (profile window of {spec.profile_steps} steps inside them), then {spec.steps} measured steps; "
             f"{spec.nproc} process(es). A rung keeps the switches of the rungs below it that ran. Gains are in "
             f"samples/s per GPU. Parity: each rung's losses against baseline's over all {spec.warmup + spec.steps} "
             f"steps, mean |diff| <= {spec.parity_abs:g} (bf16 switches) or mean relative diff <= "
             f"{spec.parity_rel:g} (FP8); a rung that changes the batch is not compared.", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(x.replace("|", "/") for x in row) + " |" for row in body]
    lines += ["", "## Switches per rung", ""]
    lines += [f"- `{r.name}` ({r.title}): " + (", ".join(f"`{k} = {json.dumps(v)}`" for k, v in r.sets.items())
                                                 or "the config as it is") for r in results]
    broken = [r.name for r in results if r.parity and r.parity["ok"] is False]
    if broken:
        lines += ["", f"**Parity broken:** {', '.join(broken)}."]
    if plots:
        lines += ["", *(f"![{p}]({p})" for p in plots)]
    else:
        why = "no rung was measured" if all(r.measured is None for r in results) else "matplotlib is not installed"
        lines += ["", f"(PNGs left out: {why}.)"]
    return "\n".join(lines) + "\n"


def plot_waterfall(results: list[RungResult], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in results if r.measured is not None]
    per = [1e3 / r.measured.samples_per_s_gpu for r in ran]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(ran) + 2), 4.5))
    for i, (r, v) in enumerate(zip(ran, per)):
        lo, hi = (0, v) if i == 0 else sorted((per[i - 1], v))
        colour = "#777777" if i == 0 else ("#2a9d4b" if v <= per[i - 1] else "#c0392b")
        ax.bar(i, hi - lo, bottom=lo, color=colour, width=0.7)
        ax.text(i, hi, f"{r.measured.step_time_s * 1e3:.0f} ms\nmb {r.measured.micro_batch}", ha="center",
                va="bottom", fontsize=7)
    ax.set_xticks(range(len(ran)), [r.name for r in ran], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("time per sample per GPU (ms)")
    ax.set_title("step time per rung (per sample; labels: step time, micro-batch)", fontsize=10)
    ax.set_ylim(0, max(per) * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_losses(results: list[RungResult], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in results if r.measured is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, style in ((ran[0], "-"), (ran[-1], "--")) if len(ran) > 1 else ((ran[0], "-"),):
        steps = sorted(r.losses)
        ax.plot(steps, [r.losses[s] for s in steps], style, label=r.name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    ax.set_title("loss: baseline and the last rung", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(spec: LadderSpec, results: list[RungResult], info: dict[str, Any]) -> str:
    """ladder.json, ladder.md and the PNGs into spec.out; returns the terminal table."""
    spec.out.mkdir(parents=True, exist_ok=True)
    plots: list[str] = []
    if any(r.measured is not None for r in results):
        try:
            plot_waterfall(results, spec.out / WATERFALL)
            plot_losses(results, spec.out / LOSSES)
            plots = [WATERFALL, LOSSES]
        except ImportError:
            plots = []
    write_atomic(spec.out / "ladder.json", json_text(to_json(spec, results, info)).encode())
    write_atomic(spec.out / "ladder.md", markdown(spec, results, info, plots).encode())
    return table(results)

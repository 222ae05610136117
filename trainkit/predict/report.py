"""The open-loop errors of `trainkit predict`, and the three ways it shows them: a table on the
terminal (rich), `predict.json` (every number, and the predicted and recorded trajectories they
come from) and `predict.png` (predicted against recorded actions over time).

Errors are in the robot's units (unnormalised): per episode and per action channel, the mean
squared error and the mean absolute error over the frames of the episode; the overall numbers
pool every frame of every episode (an episode weighs by its length). Each file is written under
a temporary name and renamed, so a folder never holds half a report.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from datakit.durable import temp_path, write_atomic
from trainkit.predict.chunks import Episode

PLOT_DIMS, PLOT_EPISODES = 8, 3  # the PNG shows the first action channels of the first episodes


def errors(predicted: np.ndarray, recorded: np.ndarray) -> dict[str, Any]:
    """MSE and MAE over every value, and per action channel (last axis), of (frames, A) arrays."""
    diff = predicted - recorded
    return {"mse": float(np.mean(diff ** 2)), "mae": float(np.mean(np.abs(diff))),
            "mse_per_dim": np.mean(diff ** 2, axis=0).tolist(), "mae_per_dim": np.mean(np.abs(diff), axis=0).tolist()}


def report(episodes: list[Episode], header: dict[str, Any]) -> dict[str, Any]:
    """predict.json's body: `header` (where the numbers come from), the overall errors, and per
    episode its errors and both trajectories."""
    pooled = errors(np.concatenate([e.predicted for e in episodes]), np.concatenate([e.recorded for e in episodes]))
    return {**header, "frames": sum(len(e.predicted) for e in episodes), "overall": pooled,
            "episodes": [{"episode_index": e.episode_index, "frames": len(e.predicted),
                          **errors(e.predicted, e.recorded), "predicted": e.predicted.tolist(),
                          "recorded": e.recorded.tolist()} for e in episodes]}


def write_json(path: Path, body: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(body, indent=1) + "\n").encode())


def table(body: dict[str, Any]) -> Any:
    """The terminal report: per episode, then per action channel (rich renderables)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text(f"open-loop action error ({body['units']}): {body['family']}, {body['steps']} steps, a chunk every "
                f"{body['every']} frames, {body['frames']} frames in all", style="bold")
    by_episode = Table()
    for name in ("episode", "frames", "MSE", "MAE"):
        by_episode.add_column(name, justify="right")
    for e in body["episodes"]:
        by_episode.add_row(str(e["episode_index"]), str(e["frames"]), f"{e['mse']:.4g}", f"{e['mae']:.4g}")
    overall = body["overall"]
    by_episode.add_row("all", str(body["frames"]), f"{overall['mse']:.4g}", f"{overall['mae']:.4g}", style="bold")
    by_dim = Table(title="per action channel, all episodes", title_justify="left")
    for name in ("dim", "name", "MSE", "MAE"):
        by_dim.add_column(name, justify="right" if name != "name" else "left")
    for i, (name, mse, mae) in enumerate(zip(body["action_names"], overall["mse_per_dim"], overall["mae_per_dim"])):
        by_dim.add_row(str(i), name, f"{mse:.4g}", f"{mae:.4g}")
    return Group(head, by_episode, by_dim)


def plot(path: Path, episodes: list[Episode], names: list[str], every: int, title: str) -> bool:
    """predict.png: for the first PLOT_EPISODES episodes (columns) and PLOT_DIMS channels (rows),
    the recorded action and the predicted one over the episode's frames, chunk starts marked;
    False (and no file) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")  # headless: no display needed, nothing shown
    import matplotlib.pyplot as plt

    fig = figure(episodes, names, every, title)
    tmp = temp_path(path)
    try:
        fig.savefig(tmp, dpi=DPI, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return True


DPI, TITLE_PT = 110, 9
TITLE_CHAR_W = 0.6  # a character's mean advance in the title font, in font sizes (DejaVu Sans: ~0.55-0.6)


def figure(episodes: list[Episode], names: list[str], every: int, title: str) -> Any:
    """The plot's matplotlib figure (`plot` saves it); the title wrapped to the figure's width and
    the axes laid out below its lines, so a long run name never runs off the image."""
    import textwrap

    import matplotlib.pyplot as plt

    shown, dims = episodes[:PLOT_EPISODES], min(PLOT_DIMS, len(names))
    fig, axes = plt.subplots(dims, len(shown), figsize=(max(6.0, 4.5 * len(shown)), 1.8 * dims + 0.8), squeeze=False,
                             sharex="col")
    for col, e in enumerate(shown):
        frames = np.arange(len(e.predicted))
        for row in range(dims):
            ax = axes[row][col]
            ax.plot(frames, e.recorded[:, row], color="black", linewidth=1.2, label="recorded")
            ax.plot(frames, e.predicted[:, row], color="tab:orange", linewidth=1.0, linestyle="--", label="predicted")
            for start in frames[::every][1:] if every > 1 else ():
                ax.axvline(start, color="0.85", linewidth=0.6, zorder=0)
            if col == 0:
                ax.set_ylabel(names[row], fontsize=8)
            ax.tick_params(labelsize=7)
        axes[0][col].set_title(f"episode {e.episode_index}", fontsize=9)
        axes[-1][col].set_xlabel("frame", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="best")
    width_pt = fig.get_figwidth() * 72 * 0.96  # a margin either side
    lines = textwrap.wrap(title, max(20, int(width_pt / (TITLE_CHAR_W * TITLE_PT))))
    fig.suptitle("\n".join(lines), fontsize=TITLE_PT)
    title_in = len(lines) * TITLE_PT * 1.3 / 72 + 0.1  # the title's lines, in inches from the top
    fig.tight_layout(rect=(0, 0, 1, 1 - title_in / fig.get_figheight()))
    return fig

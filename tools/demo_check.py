"""The last step of `make demo`: did the demo's training run learn? Reads the run folder that
`trainkit run ... --set output.dir=RUN` wrote, with the standard library only:

    python tools/demo_check.py demo-out/train --steps 30     # exit 0: the loss falls; 1: it does not

Checks: summary.json is there and counts `--steps` steps run; every step loss in metrics.jsonl is
finite; the mean loss of the last WINDOW steps is below that of the first WINDOW steps. pi05_tiny
on the demo's shards falls from about 1.05 to 0.7 in 30 steps (CPU)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

WINDOW = 5  # steps averaged at each end to say whether the loss fell


def step_losses(run: Path) -> list[float]:
    """The step losses of metrics.jsonl, in step order."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["loss"] for r in sorted((r for r in rows if r.get("kind") == "step"), key=lambda r: r["step"])]


def loss_fell(run: Path, steps: int | None = None) -> tuple[bool, str]:
    """(the run learnt, one line saying why or why not)."""
    try:
        summary = json.loads((run / "summary.json").read_text())
        losses = step_losses(run)
    except (OSError, ValueError, KeyError) as e:
        return False, f"{run}: no finished run ({e})"
    if steps is not None and summary.get("steps_run") != steps:
        return False, f"{run}/summary.json: {summary.get('steps_run')} steps run, expected {steps}"
    if len(losses) < 2 * WINDOW or not all(math.isfinite(x) for x in losses):
        return False, f"{run}/metrics.jsonl: {len(losses)} step losses, need {2 * WINDOW} finite ones"
    first, last = sum(losses[:WINDOW]) / WINDOW, sum(losses[-WINDOW:]) / WINDOW
    fell = last < first
    return fell, (f"loss, mean of the first {WINDOW} steps -> the last {WINDOW}: {first:.4f} -> {last:.4f} "
                  f"({'falling' if fell else 'NOT falling'}); summary in {run / 'summary.json'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="the run's output.dir")
    p.add_argument("--steps", type=int, default=None, help="steps the run must have run")
    args = p.parse_args(argv)
    ok, line = loss_fell(args.run, args.steps)
    print(line)
    print(f"demo {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Which samples each rank trained on: `output.record_samples = true` (debug, off by default).

    samples-rank0.jsonl   {"step": 3, "micro": 0, "epoch": 0, "loader_step": 3, "rows": [412, 17, ...]}

One file per rank in the run folder, one line per micro-batch, appended as the batch is taken
(so a resumed run continues the same file). `rows` are the frame-table rows of the samples'
anchors, the loader's sample ids (`batch["row"]`): the multi-node test checks with them that the
ranks of one step read disjoint parts of one global batch, and that a run resumed with another
world size continues the same global order. Reading the rows costs one device sync per
micro-batch, which is why this is a debug switch and not a metric.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


class SampleLog:
    """Appends one JSON line per micro-batch to `out_dir/samples-rank{rank}.jsonl`."""

    def __init__(self, out_dir: Path, rank: int):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / f"samples-rank{rank}.jsonl"
        self._file = open(self.path, "a")

    def write(self, step: int, micro: int, epoch: int, loader_step: int, rows: torch.Tensor) -> None:
        """Record one micro-batch: optimiser step, its index in the step, loader position, rows."""
        line = {"step": step, "micro": micro, "epoch": epoch, "loader_step": loader_step,
                "rows": rows.cpu().tolist()}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

"""Record the Pi0.5 tiny losses that tests/test_trainkit_family.py holds the trainer to, bit for bit.

    cd <checkout> && PYTHONPATH=$PWD .venv/bin/python tests/pi05_losses_record.py tests/assets/pi05_tiny_losses.json
    ... tests/pi05_losses_record.py tests/assets/pi05_tiny_losses.json --this-cpu   # adds this CPU's runs

It builds the loader tests' shard fixture (`test_loader_fixtures.build`, rgb), trains each run of
`RUNS` in this one process (no FSDP, one thread) and writes the losses per step, the overrides and
the torch version. The stored file was recorded from main at 79370db, before the family contract
(issue 15, part 1), and again at 979f85b, whose float64 time features (as LeRobot and openpi) moved
one loss by 2e-7; record again only when a change of the math is meant. The fixture's 32x64
frames are stretched to the tiny model's 16x16 (`model.image_resize=stretch`, the only resize when
the record was made); Pi0.5's default became LeRobot's resize-with-pad later (issue 26), so the runs
name the stretch and keep their losses. The same for the tiny preset's 8 query heads and shipped
SentencePiece tokenizer (issue 35; 4 heads and the built-in tokenizer before): the runs name
`model.heads_q=4` and `model.tokenizer=builtin`, added to the stored overrides, not re-recorded. MKL takes other kernels on
another instruction set (an AVX2 machine sums some float32 reductions in another order than the
recording's), so `--this-cpu` adds the runs under `runs_by_cpu_capability[<capability>]` beside
the main recording, and the test compares bit for bit with its own CPU's record when there is one.
The AVX2 record was made from main at 9875678, before issue 24's file moves, on an AMD EPYC.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_loader_fixtures import build  # noqa: E402
from trainkit_harness import tiny_config  # noqa: E402

COMMON = ("train.steps=6", "train.seed=7", "parallel.fsdp=none", "parallel.ac_stride={}", "output.log_every=1",
          "optim.schedule=constant", "output.resume=false")
# appended: the resize, query heads and tokenizer of the record (module docstring)
STRETCH = ("model.image_resize=stretch", "model.heads_q=4", "model.tokenizer=builtin")
RUNS = {
    "uint8_pruned": (*COMMON, "data.h2d_dtype=uint8", "data.prune_slots=true", *STRETCH),
    "float32_padded": (*COMMON, "data.h2d_dtype=float32", "data.prune_slots=false", "train.micro_batch=2",
                       "train.global_batch=4", *STRETCH),
}


def losses(shards: Path, out: Path, overrides: tuple[str, ...]) -> dict[str, float]:
    """Step -> loss of one run (keys as JSON writes them)."""
    from trainkit.train import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {str(k): v for k, v in run(tiny_config(shards, out, *overrides)).losses.items()}
    finally:
        torch.set_num_threads(threads)


def main(path: str, this_cpu: bool = False) -> None:
    here = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        shards = build(Path(tmp) / "shards", "rgb")
        runs = {name: {"overrides": list(o), "losses": losses(shards, Path(tmp) / name, o)} for name, o in RUNS.items()}
    doc = {"recorded_at_commit": commit, "torch": torch.__version__, "threads": 1, "runs": runs}
    if this_cpu:
        old = json.loads(Path(path).read_text())
        cap = torch.backends.cpu.get_cpu_capability()
        old.setdefault("runs_by_cpu_capability", {})[cap] = {"recorded_at_commit": commit, "runs": runs}
        doc = old
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], "--this-cpu" in sys.argv[2:])

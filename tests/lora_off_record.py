"""Record the DreamZero and GR00T tiny losses that tests/test_lora_off.py holds LoRA-off runs to, bit for bit
(Pi0.5's are tests/assets/pi05_tiny_losses.json, held by tests/test_trainkit_family.py).

    git archive 9a836f8 | tar -x -C /tmp/main && cd /tmp/main && \\
        PYTHONPATH=/tmp/main .venv/bin/python <checkout>/tests/lora_off_record.py <checkout>/tests/assets/lora_off_losses.json 9a836f8

Run it with the tree to record on the path (the commit before LoRA was shared by the families:
9a836f8): it builds the shard fixtures (tests/dreamzero_fixtures.py `build_3cam`, the loader's rgb
`build`), trains each family's tiny config for a few steps in this one process (no FSDP, one
thread) and writes the losses per step with the overrides, torch version and CPU capability.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dreamzero_fixtures import build_3cam  # noqa: E402
from test_loader_fixtures import build  # noqa: E402
from trainkit_harness import tiny_config  # noqa: E402

COMMON = ("train.steps=4", "train.seed=3", "parallel.fsdp=none", "parallel.ac_stride={}", "output.log_every=1",
          "optim.schedule=constant", "output.resume=false", "train.micro_batch=2")
RUNS = {"dreamzero": ("dreamzero_tiny.toml", "3cam"), "gr00t": ("gr00t_tiny.toml", "rgb")}
CONFIGS = Path(__file__).resolve().parents[1] / "trainkit" / "configs"


def losses(config: str, shards: Path, out: Path, *extra: str) -> dict[str, float]:
    """Step -> loss of one run of `config` (keys as JSON writes them)."""
    from trainkit.train import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = tiny_config(shards, out, *COMMON, *extra, config=CONFIGS / config)
        return {str(k): v for k, v in run(cfg).losses.items()}
    finally:
        torch.set_num_threads(threads)


def main(path: str, commit: str = "") -> None:
    import trainkit

    tree = Path(trainkit.__file__).resolve().parents[1]
    commit = commit or subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        shards = {"3cam": build_3cam(Path(tmp) / "3cam"), "rgb": build(Path(tmp) / "rgb", "rgb")}
        runs = {name: {"config": config, "overrides": list(COMMON), "losses": losses(config, shards[kind], Path(tmp) / name)}
                for name, (config, kind) in RUNS.items()}
    doc = {"recorded_from": str(tree), "recorded_at_commit": commit,
           "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": 1,
           "runs": runs}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])

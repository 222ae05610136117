"""A checkpoint save that cannot write names its errno, with a process group as without: DCP
gathers each rank's failure by pickling it, which drops the OSError torch.save's zip writer keeps
only as the context of "unexpected pos 704 vs 598" (the full-disk report of issue 36). Reproduced
for real, not by a stand-in writer: a child with a gloo group of one rank writes under a small
RLIMIT_FSIZE (the kernel's short write then EFBIG, as a full tmpfs gives a short write then ENOSPC).
Positive control: the same save without the limit is written."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import resource, signal, sys
import torch, torch.distributed as dist
from trainkit.checkpoint.dcp import save_checkpoint
from trainkit.checkpoint.resume_rules import RunRecord
from trainkit.errors import CheckpointError
run = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{run}/store", rank=0, world_size=1)
model = torch.nn.Linear(256, 256)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 256)).sum().backward()
opt.step()
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a signal
for step, limit in enumerate(LIMITS, start=1):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        print("saved", save_checkpoint(run, step, model, opt, sched, {}, RunRecord(config={}, dataset={}, global_batch=2)))
    except CheckpointError as e:
        print("refused", e)
dist.destroy_process_group()
"""
# at the first file's start; inside a tensor's zip record; no limit (the positive control)
LIMITS = (700, 20_000, -1)


def test_a_save_that_cannot_write_names_the_errno_under_a_process_group(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = CHILD.replace("LIMITS", repr(tuple(resource.RLIM_INFINITY if x < 0 else x for x in LIMITS)))
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    lines = [x for x in done.stdout.splitlines() if x.startswith(("saved", "refused"))]
    assert len(lines) == 3, done.stderr[-2000:]
    for step, line in enumerate(lines[:2], start=1):
        assert line.startswith(f"refused {tmp_path}/checkpoints/step-{step:06d}: not written (EFBIG: File too "
                               "large)"), line
        assert not (tmp_path / "checkpoints" / f"step-{step:06d}.tmp").exists()
    assert lines[2] == f"saved {tmp_path}/checkpoints/step-000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000003"]

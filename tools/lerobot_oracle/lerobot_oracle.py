"""Runs stock `lerobot` (0.6.1, its own Python 3.12 venv) as an oracle and a baseline.

It is never imported by datakit: tests and benchmarks call it through a subprocess with the
venv's interpreter, so lerobot's dependencies (torch < 2.12, Python >= 3.12) stay out of ours.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/lerobot_oracle.py items ROOT OUT.npz \
        --indices 0 5 23 --delta '{"action": [0, 0.1, 0.2]}'
    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/lerobot_oracle.py bench ROOT OUT.json \
        --batch-size 32 --workers 2 --batches 20
    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/lerobot_oracle.py resize IN.npz OUT.npz --size 224 224
        # each array of IN.npz ((N, C, h, w) float32 in [0, 1]) through Pi0.5's resize_with_pad_torch

Setup: python3.12 -m venv /tmp/lerobot-venv && /tmp/lerobot-venv/bin/pip install 'lerobot[dataset]==0.6.1'
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _dataset(root: str, delta: str | None, backend: str | None):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("synthetic/oracle", root=root, delta_timestamps=json.loads(delta) if delta else None,
                          video_backend=backend)


def items(args: argparse.Namespace) -> None:
    import numpy as np

    ds = _dataset(args.root, args.delta, args.backend)
    out = {}
    for i in args.indices:
        for k, v in ds[i].items():
            out[f"{i}/{k}"] = np.asarray(v) if not isinstance(v, str) else np.array(v)
    np.savez(args.out, **out)


def bench(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(max(1, args.threads))
    ds = _dataset(args.root, args.delta, args.backend)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                         generator=torch.Generator().manual_seed(0), drop_last=True)
    it = iter(loader)
    for _ in range(args.warmup):
        next(it)
    n, t0 = 0, time.perf_counter()
    for _ in range(args.batches):
        batch = next(it)
        n += batch["index"].shape[0]
    dt = time.perf_counter() - t0
    json.dump({"items": n, "seconds": dt, "items_per_s": n / dt, "backend": getattr(ds, "_video_backend", None),
               "torch": torch.__version__, "workers": args.workers, "batch_size": args.batch_size},
              open(args.out, "w"))


def resize(args: argparse.Namespace) -> None:
    """LeRobot's Pi0.5 image resize (`PI05Policy._preprocess_images`: `resize_with_pad_torch`) of
    every array in `root` (an npz), written to `out` under the same names."""
    import numpy as np
    import torch
    from lerobot.policies.common.vla_utils import resize_with_pad_torch

    height, width = args.size
    with np.load(args.root) as src:
        out = {k: resize_with_pad_torch(torch.from_numpy(src[k]), height, width).numpy() for k in src.files}
    np.savez(args.out, **out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=("items", "bench", "resize"))
    p.add_argument("root", help="the LeRobot dataset (items, bench); the input npz (resize)")
    p.add_argument("out")
    p.add_argument("--indices", type=int, nargs="*", default=[0])
    p.add_argument("--delta", default=None, help="delta_timestamps as JSON")
    p.add_argument("--backend", default=None, help="lerobot video backend (default: its own choice)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--size", type=int, nargs=2, default=(224, 224), help="resize: (height, width)")
    args = p.parse_args()
    {"items": items, "bench": bench, "resize": resize}[args.cmd](args)


if __name__ == "__main__":
    main()

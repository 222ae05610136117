"""Runs stock `lerobot` (0.6.1, its own Python 3.12 venv) as an oracle and a baseline.

It is never imported by datakit: tests and benchmarks call it through a subprocess with the
venv's interpreter, so lerobot's dependencies (torch < 2.12, Python >= 3.12) stay out of ours.

    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/lerobot_oracle.py items ROOT OUT.npz \
        --indices 0 5 23 --delta '{"action": [0, 0.1, 0.2]}'
    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/lerobot_oracle.py items ROOT OUT.npz --all --uint8
    /tmp/lerobot-venv/bin/python tools/lerobot_oracle/lerobot_oracle.py meta ROOT OUT.json   # + OUT.npz: stats
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


def _dataset(root: str, delta: str | None, backend: str | None, uint8: bool = False):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("synthetic/oracle", root=root, delta_timestamps=json.loads(delta) if delta else None,
                          video_backend=backend, return_uint8=uint8)


def _v30_root(args: argparse.Namespace) -> str:
    """args.root, or with --v21 a v3.0 copy of it made by LeRobot's own converter (LeRobot 0.6.1
    reads v3.0 only), once per --v21 folder."""
    if not args.v21:
        return args.root
    import shutil
    from pathlib import Path

    from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset

    work = Path(args.v21)
    if not (work / "meta" / "info.json").exists() or json.loads((work / "meta" / "info.json").read_text()).get(
            "codebase_version") != "v3.0":
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(args.root, work)
        convert_dataset("synthetic/oracle", root=str(work), push_to_hub=False)
    return str(work)


def _policy_delta(policy: str, meta) -> dict | None:
    """lerobot-train's delta_timestamps for a policy type at its default config."""
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.policies import make_policy_config

    return resolve_delta_timestamps(make_policy_config(policy), meta)


def items(args: argparse.Namespace) -> None:
    """ds[i] for each of --indices (every index with --all), keys "i/key", in `out` (npz); with
    --policies, under each policy's delta_timestamps as "policy/i/key" (and "policy/delta", JSON)."""
    import numpy as np

    root = _v30_root(args)
    out = {}
    for policy in args.policies or [None]:
        delta = args.delta
        if policy is not None:
            from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

            delta = json.dumps(_policy_delta(policy, LeRobotDatasetMetadata("synthetic/oracle", root=root)))
            out[f"{policy}/delta"] = np.array(delta)
        ds = _dataset(root, delta, args.backend, args.uint8)
        prefix = f"{policy}/" if policy else ""
        for i in (range(len(ds)) if args.all else args.indices):
            for k, v in ds[i].items():
                out[f"{prefix}{i}/{k}"] = np.asarray(v) if not isinstance(v, str) else np.array(v)
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


def meta(args: argparse.Namespace) -> None:
    """What lerobot-train reads of LeRobotDataset's meta (JSON), and LeRobot's statistics algorithm
    (`compute_stats`: per-episode stats over every frame, images over its sampled frames decoded by
    LeRobotDataset, then `aggregate_stats`) as "stats/key/stat" arrays in OUT.npz beside OUT.json."""
    import numpy as np
    from lerobot.datasets.compute_stats import aggregate_stats, get_feature_stats, sample_indices, \
        auto_downsample_height_width

    ds = _dataset(_v30_root(args), None, args.backend, True)
    m = ds.meta
    json.dump({"fps": m.fps, "features": m.features, "camera_keys": m.camera_keys, "video_keys": m.video_keys,
               "robot_type": m.robot_type, "tasks": m.tasks.index.tolist(), "total_episodes": m.total_episodes,
               "total_frames": m.total_frames, "has_language_columns": m.has_language_columns,
               "dataset_from_index": list(m.episodes["dataset_from_index"]),
               "dataset_to_index": list(m.episodes["dataset_to_index"]),
               "tasks_per_episode": list(m.episodes["tasks"]), "num_frames": ds.num_frames,
               "num_episodes": ds.num_episodes}, open(args.out, "w"))
    hf = ds.hf_dataset.with_format(None)
    numeric = [k for k, ft in m.features.items() if ft["dtype"] not in ("video", "image", "string")]
    per_episode = []
    for start, stop in zip(m.episodes["dataset_from_index"], m.episodes["dataset_to_index"]):
        rows = hf.select(range(start, stop))
        ep = {}
        for k in numeric:
            data = np.asarray(rows[k], dtype=np.float32 if m.features[k]["dtype"].startswith("float") else None)
            ep[k] = get_feature_stats(data, axis=0, keepdims=data.ndim == 1)
        for cam in m.camera_keys:
            imgs = np.stack([auto_downsample_height_width(ds[start + j][cam].numpy())
                             for j in sample_indices(stop - start)])
            st = get_feature_stats(imgs, axis=(0, 2, 3), keepdims=True)
            ep[cam] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in st.items()}
        per_episode.append(ep)
    stats = aggregate_stats(per_episode)
    np.savez(args.out.removesuffix(".json") + ".npz",
             **{f"stats/{k}/{s}": np.asarray(v) for k, d in stats.items() for s, v in d.items()},
             **{f"meta_stats/{k}/{s}": np.asarray(v) for k, d in m.stats.items() for s, v in d.items()})


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
    p.add_argument("cmd", choices=("items", "meta", "bench", "resize"))
    p.add_argument("root", help="the LeRobot dataset (items, bench); the input npz (resize)")
    p.add_argument("out")
    p.add_argument("--indices", type=int, nargs="*", default=[0])
    p.add_argument("--delta", default=None, help="delta_timestamps as JSON")
    p.add_argument("--all", action="store_true", help="items: every index")
    p.add_argument("--policies", nargs="*", default=None, help="items: under these policies' delta_timestamps")
    p.add_argument("--v21", default=None, help="ROOT is v2.1: read the v3.0 copy LeRobot's converter makes here")
    p.add_argument("--uint8", action="store_true", help="items: return_uint8=True, as lerobot-train asks")
    p.add_argument("--backend", default=None, help="lerobot video backend (default: its own choice)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--size", type=int, nargs=2, default=(224, 224), help="resize: (height, width)")
    args = p.parse_args()
    {"items": items, "meta": meta, "bench": bench, "resize": resize}[args.cmd](args)


if __name__ == "__main__":
    main()

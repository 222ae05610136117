"""`lerobot-train` on datakit shards: LeRobot's own trainer, its dataset factory reading shards.

    python -m datakit.lerobot.train --dataset.root=OUT --policy.type=act --batch_size=8 \\
        --output_dir=outputs/act --policy.push_to_hub=false   # any lerobot-train flag

Run in the user's own LeRobot (0.6.1) environment with datakit installed beside it. This runs
`lerobot.scripts.lerobot_train.main()` unchanged; the only change is the two names LeRobot's dataset
factory (`lerobot.datasets.factory`) builds datasets with: `LeRobotDatasetMetadata` and
`LeRobotDataset` become a `ShardMeta` and a `ShardLeRobotDataset` of `--dataset.root` (a shard
folder or URL). So delta_timestamps, image transforms, `--dataset.episodes`, `--dataset.eval_split`,
`use_imagenet_stats`, the EpisodeAwareSampler, processors, checkpoints and `--resume` are
LeRobot's own. `--dataset.repo_id` is optional: it defaults to datakit/<folder name> (it names the
run only; nothing is downloaded). Statistics are computed once per folder (`stats.py`).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from datakit.lerobot.dataset import ShardLeRobotDataset
from datakit.lerobot.meta import ShardMeta

_STATS: dict[str, dict] = {}  # root -> LeRobot statistics, computed once per process


def shard_dataset(repo_id: str, root: str | Path | None = None, episodes: list[int] | None = None,
                  image_transforms=None, delta_timestamps: dict | None = None, tolerance_s: float = 1e-4,
                  return_uint8: bool = False, **_lerobot_only: Any) -> ShardLeRobotDataset:
    """What `LeRobotDataset(...)` is called with in LeRobot's factory, on the shards at `root`
    (revision, video_backend, depth_output_unit: nothing to do for shards)."""
    if root is None:
        raise ValueError("--dataset.root must name the shard folder (datakit convert's OUT)")
    key = str(root)
    ds = ShardLeRobotDataset(root, episodes=episodes, delta_timestamps=delta_timestamps,
                             image_transforms=image_transforms, tolerance_s=tolerance_s, return_uint8=return_uint8,
                             repo_id=repo_id, stats=copy.deepcopy(_STATS[key]) if key in _STATS else None)
    _STATS.setdefault(key, copy.deepcopy(ds.meta.stats))
    return ds


def shard_meta(repo_id: str, root: str | Path | None = None, **_lerobot_only: Any) -> ShardMeta:
    """What `LeRobotDatasetMetadata(...)` is called with in LeRobot's factory."""
    return shard_dataset(repo_id, root).meta


def use_shards() -> None:
    """Point LeRobot's dataset factory at the shard dataset (nothing else of LeRobot changes)."""
    from lerobot.datasets import factory

    factory.LeRobotDataset = shard_dataset
    factory.LeRobotDatasetMetadata = shard_meta


def with_repo_id(argv: list[str]) -> list[str]:
    """argv with `--dataset.repo_id=datakit/<folder>` added when --dataset.root is given without it
    (LeRobot's config requires a repo_id; a resumed run reads both from its train_config.json)."""
    roots = [a.split("=", 1)[1] for a in argv if a.startswith("--dataset.root=")]
    if not roots or any(a.startswith("--dataset.repo_id") for a in argv):
        return argv
    return [*argv, f"--dataset.repo_id=datakit/{Path(roots[-1].rstrip('/')).name}"]


def main() -> None:
    from lerobot.scripts import lerobot_train

    use_shards()
    sys.argv = [sys.argv[0], *with_repo_id(sys.argv[1:])]
    lerobot_train.main()


if __name__ == "__main__":
    main()

"""datakit shards inside LeRobot's own trainer.

`ShardLeRobotDataset` (dataset.py) is a LeRobotDataset over a shard folder: the same items, meta
and statistics (meta.py, stats.py), nothing decoded. `python -m datakit.lerobot.train
--dataset.root=OUT <lerobot-train flags>` (train.py) runs LeRobot's own `train()` on it.
Only train.py imports lerobot; the dataset needs numpy, pyarrow and torch (and pandas for
`meta.tasks`, which LeRobot's environment has).
"""
from datakit.lerobot.dataset import ShardLeRobotDataset
from datakit.lerobot.meta import ShardMeta

__all__ = ["ShardLeRobotDataset", "ShardMeta"]

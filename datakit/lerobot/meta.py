"""`ShardMeta`: the `LeRobotDatasetMetadata` surface that LeRobot 0.6.1's trainer reads, from a shard index.

`lerobot_train.train()`, `make_policy`, `make_pre_post_processors` and `EpisodeAwareSampler` read:
`features` (dtype, shape, names per feature), `stats` (numpy arrays per feature and statistic),
`fps`, `camera_keys` / `video_keys` / `image_keys` / `depth_keys`, `robot_type`, `tasks` (a pandas
frame indexed by the task text, column `task_index`), `episodes` (a table: `episodes["column"]`
is a list, `episodes[i]` a row dict, with `dataset_from_index` / `dataset_to_index`), and
`has_language_columns`. The features are the source's own (its info.json, recorded at conversion
as `source["described"]`) for the columns the shards hold: the cameras, observation.state, action
and the five index columns; other source columns (next.reward, ...) are not in shards and not
listed. An index written before the description was kept gets features built from the index
(cameras as videos (H, W, 3), names from the index).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from datakit import source_paths
from datakit.shards.index import ShardIndex

STATE, ACTION = source_paths.LEROBOT_STATE_KEY, source_paths.LEROBOT_ACTION_KEY
INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class EpisodesTable:
    """The columns of LeRobot's `meta.episodes` the trainer and reader use, one row per episode in
    index order: `t["dataset_from_index"]` (a list), `t[i]` (a dict), `len(t)`."""

    def __init__(self, columns: dict[str, list[Any]]):
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            return self.columns[key]
        return {k: v[key] for k, v in self.columns.items()}

    @property
    def column_names(self) -> list[str]:
        return list(self.columns)


@dataclass
class ShardMeta:
    """What `LeRobotDatasetMetadata` gives a trainer, for a shard folder."""

    repo_id: str
    root: str
    fps: int | float
    features: dict[str, dict[str, Any]]
    stats: dict[str, dict[str, np.ndarray]]
    task_list: list[str]
    episodes: EpisodesTable
    robot_type: str | None = None

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] in ("video", "image")]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == "image"]

    @property
    def depth_keys(self) -> list[str]:
        return []  # shards hold uint8 RGB frames

    @property
    def has_language_columns(self) -> bool:
        return False

    @property
    def names(self) -> dict[str, Any]:
        return {k: ft.get("names") for k, ft in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(ft["shape"]) for k, ft in self.features.items()}

    @property
    def total_episodes(self) -> int:
        return len(self.episodes)

    @property
    def total_frames(self) -> int:
        return int(sum(self.episodes["length"]))

    @property
    def total_tasks(self) -> int:
        return len(self.task_list)

    @property
    def tasks(self):
        """LeRobot's task frame (pandas: index = task text, column task_index)."""
        import pandas as pd  # LeRobot's environment has it; datakit does not need it otherwise

        return pd.DataFrame({"task_index": range(len(self.task_list))}, index=pd.Index(self.task_list, name="task"))

    def get_task_index(self, task: str) -> int | None:
        return self.task_list.index(task) if task in self.task_list else None


def lerobot_features(index: ShardIndex) -> dict[str, dict[str, Any]]:
    """The LeRobot features of what the shards hold: the source's own description where the
    conversion recorded it, else built from the index."""
    described = (index.source.get("described") or {}).get("features") or {}
    out: dict[str, dict[str, Any]] = {}
    for cam, entry in index.cameras.items():
        ft = described.get(cam)
        if ft is None or _stored_hw(ft) != (entry.height, entry.width):  # resized at conversion: the stored size
            ft = {"dtype": "video", "shape": [entry.height, entry.width, 3], "names": ["height", "width", "channels"],
                  "info": {"video.fps": index.fps, "video.height": entry.height, "video.width": entry.width,
                           "video.channels": 3}}
        out[cam] = dict(ft)
    for key, names in ((STATE, index.state_names), (ACTION, index.action_names)):
        out[key] = dict(described.get(key) or {"dtype": "float32", "shape": [len(names)], "names": list(names)})
    for key in INDEX_FEATURES:
        out[key] = dict(described.get(key) or {"dtype": "float32" if key == "timestamp" else "int64", "shape": [1],
                                               "names": None})
    return out


def _stored_hw(ft: dict[str, Any]) -> tuple[int, int] | None:
    shape, names = ft.get("shape"), ft.get("names")
    if not isinstance(shape, list) or len(shape) != 3:
        return None
    if isinstance(names, list) and "height" in names and "width" in names:
        return shape[names.index("height")], shape[names.index("width")]
    return (shape[1], shape[2]) if shape[0] in (1, 3, 4) else (shape[0], shape[1])


def episodes_table(index: ShardIndex) -> EpisodesTable:
    """One row per episode in the index: episode_index, tasks, length, dataset_from_index,
    dataset_to_index (rows of the frames table, which are the items' `index`)."""
    eps = index.episodes
    return EpisodesTable({
        "episode_index": [e.episode_index for e in eps],
        "tasks": [[e.task] for e in eps],
        "length": [e.length for e in eps],
        "dataset_from_index": [e.row_start for e in eps],
        "dataset_to_index": [e.row_start + e.length for e in eps],
    })

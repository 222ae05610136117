"""`ShardLeRobotDataset`: a LeRobotDataset over datakit shards, for LeRobot's own trainer.

    from datakit.lerobot import ShardLeRobotDataset
    ds = ShardLeRobotDataset("OUT", delta_timestamps={"action": [i / 30 for i in range(100)]})
    ds[0]  # the dict LeRobotDataset("...", root=SRC, delta_timestamps=...)[0] returns

Items follow LeRobot 0.6.1's `DatasetReader.get_item`: every camera as (C, H, W) at its stored
size (float in [0, 1], or uint8 with `return_uint8=True`, as `lerobot-train` asks), observation.state,
action, timestamp, frame_index, episode_index, index, task_index, `task`; for each key of
`delta_timestamps` (cameras, observation.state, action) the frames at round(delta * fps) rows from
the anchor, clamped to its episode, with `<key>_is_pad` marking the clamped ones; a camera with one
delta comes back without the time axis, as LeRobot's squeeze does. Nothing is decoded: a frame is
a slice of a memory-mapped shard (`datakit.reader`). `index` is the row of the shards' frames
table, which is the source's index when the conversion skipped no episode.

`meta` is a `ShardMeta` (features, LeRobot-style statistics from the shards (`stats.py`), fps,
tasks, episodes table). `episodes` selects episodes (positions in the index, which are the
episode indices of a conversion that skipped none); then, as in LeRobot, `len` counts their
frames and `absolute_to_relative_idx` maps `index` to a position. Picklable for DataLoader
workers: the state is the arguments and the metadata; each worker maps the files again.
A remote root (`s3://...`) reads through the download cache, as `ShardLoader` does.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from datakit.lerobot.meta import ACTION, STATE, ShardMeta, episodes_table, lerobot_features
from datakit.lerobot.stats import cached, default_stats_dir, lerobot_stats
from datakit.reader import ShardReader, open_shards
from datakit.shards.index import column
from datakit.stages.colour import nv12_to_rgb


class ShardLeRobotDataset(torch.utils.data.Dataset):
    """LeRobotDataset's interface and items over a shard folder (local path or URL)."""

    def __init__(self, root: str | Path, episodes: list[int] | None = None,
                 delta_timestamps: dict[str, list[float]] | None = None, image_transforms: Callable | None = None,
                 *, tolerance_s: float = 1e-4, return_uint8: bool = False, repo_id: str | None = None,
                 stats: dict[str, dict[str, Any]] | None = None, stats_dir: str | Path | None | bool = True,
                 verify: str = "size",
                 cache_dir: str | Path | None = None, cache_bytes: int = 0,
                 storage_options: dict[str, Any] | None = None):
        """`stats`: LeRobot statistics to use instead of computing them from the shards (a dataset
        built again from the same folder, e.g. a training split, passes the full set's).
        `stats_dir`: where computed statistics are cached per conversion (True: the default
        folder, `stats.default_stats_dir`; None or False: no cache)."""
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("image_transforms must be callable or None")
        self.root = root
        self.image_transforms = image_transforms
        self.tolerance_s = tolerance_s
        self.return_uint8 = return_uint8
        self._open_args = {"verify": verify, "cache_dir": cache_dir, "cache_bytes": cache_bytes,
                           "storage_options": storage_options}
        self._open()
        index = self.reader.index
        eps = episodes_table(index)
        if stats is None:
            where = default_stats_dir() if stats_dir is True else (Path(stats_dir) if stats_dir else None)
            stats = cached(index.to_json(), lambda: self._compute_stats(eps), where)
        name = Path(str(root).rstrip("/")).name
        described = index.source.get("described") or {}
        self.meta = ShardMeta(repo_id=repo_id or f"datakit/{name}", root=str(root), fps=_fps(index.fps),
                              features=lerobot_features(index), stats=stats, task_list=list(index.tasks),
                              episodes=eps, robot_type=described.get("robot_type"))
        self.episodes = self._positions(episodes)
        self.delta_indices = None if delta_timestamps is None else self._delta_indices(delta_timestamps)
        self._select()

    # -- opening (again in each worker) ---------------------------------------------------------
    def _open(self) -> None:
        self.reader: ShardReader = open_shards(self.root, **self._open_args)
        frames = self.reader.frames
        self._state, self._action = column(frames, "state"), column(frames, "action")
        self._cols = {k: column(frames, k) for k in ("timestamp", "frame_index", "episode_index", "task_index")}
        self._ep_of_row = np.repeat(np.arange(len(self.reader.index.episodes)),
                                    [e.length for e in self.reader.index.episodes])

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("reader", "_state", "_action", "_cols", "_ep_of_row")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def close(self) -> None:
        self.reader.close()

    # -- selection and windows ------------------------------------------------------------------
    def _positions(self, episodes: list[int] | None) -> list[int] | None:
        if episodes is None:
            return None
        where = {e: i for i, e in enumerate(self.meta.episodes["episode_index"])}
        missing = [e for e in episodes if e not in where]
        if missing:
            raise ValueError(f"episodes {missing[:8]} are not in {self.root} (it has {len(where)} episodes)")
        return [where[e] for e in episodes]

    def _select(self) -> None:
        starts, stops = self.meta.episodes["dataset_from_index"], self.meta.episodes["dataset_to_index"]
        if self.episodes is None:
            self._rows = np.arange(self.reader.index.num_frames, dtype=np.int64)
            self.absolute_to_relative_idx = None
        else:  # in row order, as LeRobot's filtered hf_dataset is
            self._rows = np.concatenate([np.arange(starts[p], stops[p]) for p in sorted(set(self.episodes))]
                                        ).astype(np.int64)
            self.absolute_to_relative_idx = dict(zip(self._rows.tolist(), range(self._rows.size)))

    def _delta_indices(self, delta_timestamps: dict[str, list[float]]) -> dict[str, np.ndarray]:
        """LeRobot's check (each delta a multiple of 1/fps within tolerance_s) and round(delta * fps)."""
        fps = self.meta.fps
        out = {}
        for key, deltas in delta_timestamps.items():
            if key not in self.meta.camera_keys and key not in (STATE, ACTION):
                raise ValueError(f"delta_timestamps key {key!r}: the shards hold windows of the cameras, "
                                 f"{STATE!r} and {ACTION!r} only")
            frames = np.asarray(deltas, np.float64) * fps
            off = np.abs(frames - np.round(frames)) / fps
            if (off > self.tolerance_s).any():
                raise ValueError(f"delta_timestamps[{key!r}] {list(deltas)} are not multiples of 1/fps "
                                 f"(fps {fps}, tolerance_s {self.tolerance_s})")
            out[key] = np.round(frames).astype(np.int64)
        return out

    # -- LeRobotDataset's properties ------------------------------------------------------------
    @property
    def fps(self) -> int | float:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.meta.features

    @property
    def repo_id(self) -> str:
        return self.meta.repo_id

    @property
    def num_frames(self) -> int:
        return int(self._rows.size)

    @property
    def num_episodes(self) -> int:
        return len(self.episodes) if self.episodes is not None else self.meta.total_episodes

    def __len__(self) -> int:
        return self.num_frames

    def __repr__(self) -> str:
        return (f"ShardLeRobotDataset(root={str(self.root)!r}, episodes={self.num_episodes}, "
                f"frames={self.num_frames}, features={list(self.features)})")

    # -- items ----------------------------------------------------------------------------------
    def __getitem__(self, i: int) -> dict[str, Any]:
        row = int(self._rows[int(i)])
        ep = int(self._ep_of_row[row])
        start, stop = self.meta.episodes["dataset_from_index"][ep], self.meta.episodes["dataset_to_index"][ep]
        rows, pads = {}, {}
        for key, d in (self.delta_indices or {}).items():
            want = row + d
            rows[key] = np.clip(want, start, stop - 1)
            pads[f"{key}_is_pad"] = torch.from_numpy((want < start) | (want >= stop))
        item: dict[str, Any] = {}
        for cam in self.meta.camera_keys:
            if cam in rows:
                frames = torch.stack([self._frame(int(r), cam) for r in rows[cam]])
                item[cam] = frames[0] if frames.shape[0] == 1 else frames
            else:
                item[cam] = self._frame(row, cam)
        for key, col in ((STATE, self._state), (ACTION, self._action)):
            item[key] = torch.from_numpy(np.array(col[rows[key]] if key in rows else col[row]))
        item["timestamp"] = torch.tensor(self._cols["timestamp"][row], dtype=torch.float32)
        for key in ("frame_index", "episode_index"):
            item[key] = torch.tensor(int(self._cols[key][row]))
        item["index"] = torch.tensor(row)
        task = int(self._cols["task_index"][row])
        item["task_index"] = torch.tensor(task)
        item.update(pads)
        if self.image_transforms is not None:
            for cam in self.meta.camera_keys:
                item[cam] = self.image_transforms(item[cam])
        item["task"] = self.meta.task_list[task]
        return item

    def _frame(self, row: int, cam: str) -> torch.Tensor:
        """(C, H, W) of one stored frame: uint8, or float in [0, 1] as LeRobot's decoders give it."""
        raw = self.reader.read_raw(row, cam)  # a read-only view of the mapped shard
        if self.reader.index.layout == "nv12":
            chw = nv12_to_rgb(torch.from_numpy(np.array(raw))[None])[0].permute(2, 0, 1).contiguous()
        else:  # one copy: the transposing gather out of the map
            chw = torch.from_numpy(np.ascontiguousarray(raw.transpose(2, 0, 1)))
        return chw if self.return_uint8 else chw.float().div_(255.0)

    # -- statistics -----------------------------------------------------------------------------
    def _compute_stats(self, eps) -> dict[str, dict[str, np.ndarray]]:
        cols = {STATE: self._state, ACTION: self._action, "timestamp": self._cols["timestamp"].astype(np.float32),
                **{k: self._cols[k] for k in ("frame_index", "episode_index", "task_index")},
                "index": np.arange(self.reader.index.num_frames, dtype=np.int64)}
        spans = list(zip(eps["dataset_from_index"], eps["length"]))
        return lerobot_stats(cols, spans, {cam: (lambda r, c=cam: self._rgb(r, c)) for cam in self.reader.index.cameras})

    def _rgb(self, row: int, cam: str) -> np.ndarray:
        """(H, W, 3) uint8 of one stored frame."""
        raw = self.reader.read_raw(row, cam)
        if self.reader.index.layout == "nv12":
            return nv12_to_rgb(torch.from_numpy(np.array(raw))[None])[0].numpy()
        return raw


def _fps(fps: float) -> int | float:
    """LeRobot's fps is an int; keep a fractional rate as it is."""
    return int(fps) if float(fps).is_integer() else fps

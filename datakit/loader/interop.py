"""Other frameworks over the same shards: LeRobot-style items, WebDataset URLs.

`LeRobotView` gives the item dict that `lerobot.datasets.LeRobotDataset.__getitem__` returns
(camera images as CHW float in [0, 1], each camera at its stored size as LeRobot returns it,
`observation.state`, `action` with `action_is_pad`, `task` text, indices), so training code
written for LeRobotDataset, and its plain `torch.utils.data.DataLoader` with the default
collate, run unchanged. Values are raw, as in
LeRobot, where normalisation belongs to the policy. `webdataset_urls` lists the shard files
for `webdataset.WebDataset(urls)`, which reads them because they are plain tars of
`<episode>/<frame>.<field>` members.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.utils.data

from datakit.loader.config import LoaderConfig
from datakit.loader.dataset import ShardDataset
from datakit.loader.slots import slot_images
from datakit.shards.index import load_index
from datakit.stages.colour import nv12_to_rgb_float


def webdataset_urls(root: str | Path) -> list[str]:
    """The shard paths in index order, for `webdataset.WebDataset(urls)`."""
    root = Path(root)
    return [str(root / s.name) for s in load_index(root).shards]


def lerobot_config(fps: float, delta_timestamps: dict[str, list[float]] | None = None, **kw) -> LoaderConfig:
    """A LoaderConfig from LeRobot's `delta_timestamps` (seconds; converted to frame offsets).

    Keys: camera names, "observation.state" and "action"; the action deltas must be the
    consecutive frames 0, 1/fps, ..., as LeRobot policies request them."""
    dt = dict(delta_timestamps or {})
    to_frames = lambda secs: tuple(int(round(s * fps)) for s in secs)  # noqa: E731
    action = to_frames(dt.pop("action", [0.0]))
    if action != tuple(range(len(action))):
        raise ValueError(f"action deltas must be 0, 1/fps, 2/fps, ... (got frame offsets {action})")
    state = to_frames(dt.pop("observation.state", [0.0]))
    cams = {k: to_frames(v) for k, v in dt.items()}
    return LoaderConfig(camera_offsets=cams, state_offsets=state, action_horizon=len(action), boundary="pad",
                        prune_slots=False, shuffle="sequential", **kw)


class LeRobotView(torch.utils.data.Dataset):
    """LeRobotDataset-shaped items over `ShardDataset` (all anchors, episode ends padded)."""

    def __init__(self, root: str | Path, cfg: LoaderConfig | None = None):
        cfg = cfg or LoaderConfig(boundary="pad", prune_slots=False, shuffle="sequential")
        if cfg.boundary != "pad" or cfg.prune_slots:
            raise ValueError("LeRobotView needs boundary='pad' and prune_slots=False (one item per frame, fixed keys)")
        self.ds = ShardDataset(root, cfg)
        self.tasks = self.ds.index.tasks
        self.nv12 = self.ds.index.layout == "nv12"

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, object]:
        s = self.ds[int(i)]
        item: dict[str, object] = {}
        views = slot_images(s, batched=False)  # every slot kept (prune_slots=False): view j is slot j
        for j, cam in enumerate(self.ds.slots.cameras):
            if cam is None:
                continue
            frames = views[j]  # (T, *frame_shape) uint8, at this camera's stored size
            chw = nv12_to_rgb_float(frames) if self.nv12 else frames.permute(0, 3, 1, 2).float()
            chw = chw.div_(255.0)
            multi = len(self.ds.cfg.offsets_for(cam)) > 1
            item[cam] = chw if multi else chw[0]
            if multi:
                item[f"{cam}_is_pad"] = s["image_is_pad"][j]
        multi_state = len(self.ds.cfg.state_offsets) > 1
        item["observation.state"] = s["state"] if multi_state else s["state"][0]
        if multi_state:
            item["observation.state_is_pad"] = s["state_is_pad"]
        horizon = self.ds.cfg.action_horizon
        item["action"] = s["action"] if horizon > 1 else s["action"][0]
        if horizon > 1:
            item["action_is_pad"] = s["action_is_pad"]
        item["timestamp"] = s["timestamp"].float()
        item["frame_index"] = s["frame_index"]
        item["episode_index"] = s["episode_index"]
        item["index"] = s["row"]
        item["task_index"] = s["task_index"]
        item["task"] = self.tasks[int(s["task_index"])]
        return item

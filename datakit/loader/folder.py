"""`FolderDataset`: what the frame and the feature dataset share, written once.

`ShardDataset` (a converted folder of frames) and `FeatureDataset` (a folder of `datakit encode`)
open a root the same way (a folder or a URL through the node-local download cache), pickle to the
same four fields for DataLoader workers (which re-open the files: nothing big travels), close the
same two things, count their positions the same way and keep a batch row whose shard read failed
out of the batch the same way. A subclass writes `_open(index)`: read the index, set `self.anchors`
(one entry per position), `self.files` (`OpenShards`) and `self.num_skipped`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from datakit.loader.config import LoaderConfig
from datakit.loader.reads import ReadPlan, ShardFiles, read_frames
from datakit.storage.cache import ShardCache
from datakit.storage.roots import open_root


class FolderDataset(torch.utils.data.Dataset):
    """Map-style dataset over one opened folder: position i is `self.anchors[i]`; batches via `__getitems__`."""

    def __init__(self, root: str | Path, cfg: LoaderConfig, *,
                 opened: tuple[Path, ShardCache | None, Any] | None = None):
        """`opened`: (folder, cache, index or None) of `root` as the caller already opened it
        (`open_loader_root`, the index loaded), so a trainer that checks the index first opens it once."""
        self.cfg = cfg
        self.folder, self.cache, index = opened if opened is not None else (*open_loader_root(root, cfg), None)
        self.root = root_name(self.folder, self.cache)
        self._open(index)

    def _open(self, index: Any = None) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        # workers re-map the files; nothing big is pickled (the cache travels without its download thread)
        return {"root": self.root, "folder": self.folder, "cache": self.cache, "cfg": self.cfg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root, self.folder, self.cache, self.cfg = state["root"], state["folder"], state["cache"], state["cfg"]
        self._open()

    def close(self) -> None:
        """Close this process's shard files and stop the cache's download thread."""
        self.files.close()
        if self.cache is not None:
            self.cache.close()

    def __len__(self) -> int:
        return int(self.anchors.shape[0])

    def __getitems__(self, positions: list[int]) -> dict[str, torch.Tensor]:
        return self.read_batch(positions)

    def read_planned(self, files: ShardFiles, plan: ReadPlan, frame_bytes: np.ndarray, b: int) -> np.ndarray:
        """Run `plan` (`reads.read_frames`); (b,) ok: False for a batch row whose shard failed
        (`on_error="skip"`; "raise" raises). `files`: what maps the plan's shard numbers to files."""
        # one frame size: the scalar lets read_frames skip a gather
        sizes = int(frame_bytes[0]) if frame_bytes.size and (frame_bytes == frame_bytes[0]).all() else frame_bytes
        failed = read_frames(files, plan, sizes, self.cfg.coalesce_gap)
        ok = np.ones(b, bool)
        if failed:
            if self.cfg.on_error == "raise":
                raise next(iter(failed.values()))
            ok[np.unique(plan.owner[np.isin(plan.shard, list(failed))])] = False
            self.num_skipped += int((~ok).sum())
        return ok


def open_loader_root(root: str | Path, cfg: LoaderConfig) -> tuple[Path, ShardCache | None]:
    """(local folder of the index files, download cache or None) of a loader's root, path or URL,
    with `cfg`'s cache settings (`storage.roots.open_root`): frame and feature folders alike."""
    return open_root(root, verify=cfg.verify, cache_dir=cfg.cache_dir, cache_bytes=cfg.cache_bytes,
                     storage_options=cfg.storage_options)


def root_name(folder: Path, cache: ShardCache | None) -> str | Path:
    """What errors name: the local folder, or the URL of a remote root."""
    return cache.root_url if cache is not None else folder


def keep_episodes(anchors: np.ndarray, anchor_episode: np.ndarray, wanted: list[int] | tuple[int, ...] | None,
                  none_left: str) -> np.ndarray:
    """The `anchors` whose episode (`anchor_episode`, one per anchor) is in `wanted` (all when None);
    ValueError "episodes [...] hold no <none_left>" when none is."""
    if wanted is None:
        return anchors
    kept = anchors[np.isin(anchor_episode, np.asarray(wanted, np.int64))]
    if not kept.size:
        raise ValueError(f"episodes {list(wanted)[:8]} hold no {none_left}")
    return kept


def drop_failed(batch: dict[str, torch.Tensor], ok: np.ndarray) -> dict[str, torch.Tensor]:
    """The batch without the items whose shard failed (`on_error="skip"`), and their count `num_skipped`."""
    if not ok.all():
        sel = torch.from_numpy(np.flatnonzero(ok))
        batch = {k_: (v if k_ == "slot_index" else v.index_select(0, sel)) for k_, v in batch.items()}
    batch["num_skipped"] = torch.tensor(int((~ok).sum()))
    return batch

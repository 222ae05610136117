"""`FeatureDataset`: the loader's view of a feature folder (`datakit encode`), read exactly as frames are.

`ShardLoader` opens one when the folder's index is a feature index (`open_dataset`); the sampler,
rank split, resume, workers, shared-memory ring and lent batches are the frame loader's, unchanged:
a position is a clip (a row of the clip table) instead of an anchor frame. A batch's tensors are
read with the frame loader's coalesced `preadv` (`reads.read_frames`) straight into one lent
buffer, then viewed at their dtype and shape (`host_view`): no copy, no parse. A remote root
(`s3://...`, `gs://...`) is opened as a frame folder's is (`folder.open_loader_root`): index files
from the node-local cache folder, each shard from the download cache.

Batch keys (B clips; C, T', H', W' the latent shape; L the longest prompt of the batch):
  latents (B, C, T', H', W')       the VAE posterior mode, in the stored dtype (bfloat16 by default)
  cond_latents (B, C, T'-1, H', W') first-frame conditioning (only if encoded with --cond first-frame)
  image (B, 257, 1280)             CLIP features of the first frame (only with --image-encoder)
  text (B, L, width), text_mask (B, L) bool   the prompt's real tokens, zero-padded per batch
                                   (only with --text-encoder; looked up by the clip's prompt id)
  state (B, S) float32             at the clip's first frame; action (B, span, A) float32: every
                                   source frame the clip spans (normalised on the device, as frames)
  episode_index, start, task_index, prompt, row (B,) int64; num_skipped () int64
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.utils.data

from datakit.loader.config import LoaderConfig
from datakit.loader.dataset import ShardDataset
from datakit.loader.folder import FolderDataset, drop_failed, keep_episodes, open_loader_root
from datakit.loader.normalise import affine_from_stats
from datakit.loader.reads import ReadPlan
from datakit.loader.shm_pool import FEATURE_BYTES
from datakit.shards.features import (
    DTYPES, FeatureIndex, check_clip_reads, is_feature_folder, load_clips, load_features, torch_dtype,
)
from datakit.shards.index import OFFSET_PREFIX, column
from datakit.shards.names import FRAMES_NAME
from datakit.shards.open_files import OpenShards

META = ("episode_index", "start", "task_index", "prompt")


class FeatureDataset(FolderDataset):
    """Map-style dataset over a feature folder: position i is the i-th clip (of `cfg.episodes`). `root`: a
    folder or a URL (`s3://...`), opened as `ShardDataset` opens one; `opened`: (folder, cache, index or
    None) of `root` as the caller already opened it (`FolderDataset`)."""

    def _open(self, index: FeatureIndex | None = None) -> None:
        cfg = self.cfg
        self.index: FeatureIndex = index if index is not None else load_features(self.folder)
        table = load_clips(self.folder, self.index)
        self.fields = list(self.index.fields)
        self.shard = column(table, "shard")
        self.offsets = {f: column(table, OFFSET_PREFIX + f) for f in self.fields}
        check_clip_reads(self.index, self.shard, self.offsets, self.folder / FRAMES_NAME)
        self.meta = {k: column(table, k) for k in META}
        self.state = column(table, "state")
        self.action = column(table, "action")
        self.anchors = keep_episodes(np.arange(self.index.num_clips, dtype=np.int64), self.meta["episode_index"],
                                     cfg.episodes, f"clip of {self.folder}")
        self.field_bytes = [self.index.fields[f].bytes for f in self.fields]
        self.num_frames, self.slot_bytes = 1, (sum(self.field_bytes),)  # what the shared-memory ring is sized by
        self.files = OpenShards(self.folder, self.index.shards, verify=cfg.verify, max_open=cfg.max_open_shards,
                                cache=self.cache)
        self.texts = self._prompts() if self.index.prompts else []
        self.files.close()  # a remote root's cache would count the prompts' shard as held open until then
        self.num_skipped = 0

    def _prompts(self) -> list[torch.Tensor]:
        """Every prompt's (tokens, width) embedding, read once (a few per dataset, small)."""
        dtype = torch_dtype(self.index.text_dtype)
        out = []
        for p in self.index.prompts:
            n = p.tokens * self.index.text_width * dtype.itemsize
            data = np.array(self.files.bytes(p.shard)[p.offset : p.offset + n])
            out.append(torch.from_numpy(data).view(dtype).view(p.tokens, self.index.text_width))
        return out

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        batch = self.host_view(self.read_batch([int(i)]))
        return {k: (v[0] if v.dim() and k != "num_skipped" else v) for k, v in batch.items()}

    def read_batch(self, positions: list[int] | np.ndarray,
                   alloc: Callable[[tuple[int, ...]], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The batch of `positions`, its tensors as raw bytes (`feature_bytes.<field>` (B, bytes)) in
        one buffer from `alloc` (a worker's ring buffer) or a new one; `host_view` types them."""
        rows = self.anchors[np.asarray(positions, np.int64)]
        b = rows.size
        flat = alloc((b * self.slot_bytes[0],)) if alloc is not None else torch.empty(b * self.slot_bytes[0],
                                                                                          dtype=torch.uint8)
        view, raw, at = memoryview(flat.numpy()), {}, 0
        shards, offs, dests, owners, sizes = [], [], [], [], []
        for f, n in zip(self.fields, self.field_bytes):
            raw[FEATURE_BYTES + f] = flat[at : at + b * n].view(b, n)
            shards.append(self.shard[rows])
            offs.append(self.offsets[f][rows])
            dests += [view[at + k * n : at + (k + 1) * n] for k in range(b)]
            owners.append(np.arange(b))
            sizes.append(np.full(b, n, np.int64))
            at += b * n
        plan = ReadPlan(shard=np.concatenate(shards), offset=np.concatenate(offs), dest=dests,
                        owner=np.concatenate(owners))
        ok = self.read_planned(self.files, plan, np.concatenate(sizes), b)
        a = len(self.index.action_names)
        batch = {**raw, "state": torch.from_numpy(self.state[rows]),
                 "action": torch.from_numpy(self.action[rows].reshape(b, self.index.span, a)),
                 "row": torch.from_numpy(rows),
                 **{k: torch.from_numpy(np.ascontiguousarray(v[rows])) for k, v in self.meta.items()}}
        if self.texts:
            batch.update(self._text(self.meta["prompt"][rows]))
        return drop_failed(batch, ok)

    def _text(self, prompts: np.ndarray) -> dict[str, torch.Tensor]:
        """(B, L, width) zero-padded to the batch's longest prompt, and its mask; a clip without a
        prompt (-1) gets no tokens."""
        lens = [self.texts[p].shape[0] if p >= 0 else 0 for p in prompts.tolist()]
        width, dtype = self.index.text_width, torch_dtype(self.index.text_dtype)
        text = torch.zeros((len(lens), max(lens + [1]), width), dtype=dtype)
        mask = torch.zeros(text.shape[:2], dtype=torch.bool)
        for k, (p, n) in enumerate(zip(prompts.tolist(), lens)):
            if n:
                text[k, :n] = self.texts[p]
                mask[k, :n] = True
        return {"text": text, "text_mask": mask}

    def host_view(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw `feature_bytes.<field>` (B, bytes) -> `<field>` at its dtype and shape (views: a lent
        buffer stays lent)."""
        out = {k: v for k, v in batch.items() if not k.startswith(FEATURE_BYTES)}
        for f in self.fields:
            raw = batch[FEATURE_BYTES + f]
            e = self.index.fields[f]
            out[f] = raw.view(torch_dtype(e.dtype)).view(raw.shape[0], *e.shape)
        return out

    def normaliser(self) -> "FeatureNormaliser":
        return FeatureNormaliser(affine_from_stats(self.index.stats["state"], self.cfg.norm),
                                 affine_from_stats(self.index.stats["action"], self.cfg.norm))


@dataclass
class FeatureNormaliser:
    """The device-side transform of a feature batch: state and action mapped with the source's
    statistics (as for frames); latents and embeddings pass as stored."""

    state_affine: tuple[torch.Tensor, torch.Tensor]
    action_affine: tuple[torch.Tensor, torch.Tensor]

    def to(self, device: torch.device | str) -> "FeatureNormaliser":
        return FeatureNormaliser(tuple(t.to(device) for t in self.state_affine),
                                 tuple(t.to(device) for t in self.action_affine))

    def __call__(self, batch: dict[str, torch.Tensor], *, epoch: int = 0, step: int = 0) -> dict[str, torch.Tensor]:
        out = dict(batch)
        out["state"] = batch["state"].float() * self.state_affine[0] + self.state_affine[1]
        out["action"] = batch["action"].float() * self.action_affine[0] + self.action_affine[1]
        return out


def feature_batch_bytes(index: FeatureIndex, batch_size: int) -> int:
    """Bytes of one batch's clip tensors (what `datakit plan` counts per step)."""
    return batch_size * sum(math.prod(f.shape) * DTYPES[f.dtype][0].itemsize for f in index.fields.values())


def open_dataset(root: str | Path, cfg: LoaderConfig) -> ShardDataset | FeatureDataset:
    """The dataset of one folder, path or URL, its root opened once: a feature folder's (index.json of
    `datakit encode`) `FeatureDataset`, else `ShardDataset`."""
    folder, cache = open_loader_root(root, cfg)
    try:
        kind = FeatureDataset if is_feature_folder(folder) else ShardDataset
        return kind(root, cfg, opened=(folder, cache, None))
    except BaseException:
        if cache is not None:
            cache.close()
        raise


__all__ = ["FeatureDataset", "FeatureNormaliser", "feature_batch_bytes", "open_dataset"]

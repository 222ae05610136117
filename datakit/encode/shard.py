"""One feature shard, start to finish, by the shards' commit protocol: members appended to
`shard-N.tar.tmp` (`OutputShard`: hashed on the fly, output errors named), then fsync, rename and
journal. Plain data in (a job: the shard number and its clips, or the prompts), a journal out, so
the local engine and the Ray engine write a shard the same way.

A clip's members, under the key `<episode:06d>/<start:06d>`: latents, cond_latents, image (those
the run makes) and a small json. Clips go through the VAE `batch` at a time, in plan order, so the
same plan gives the same calls and the same bytes.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from datakit.convert.shard import OutputShard
from datakit.encode.canvas import canvas_frame_u8, canvas_normaliser, read_views, tiled_clips
from datakit.encode.clips import Clip
from datakit.encode.config import EncodeConfig
from datakit.encode.journal import FeatureJournal, write_journal
from datakit.encode.models import Encoders, to_vae_input
from datakit.errors import output_error
from datakit.loader.normalise import Normaliser
from datakit.convert.journal import journal_path
from datakit.reader import ShardReader
from datakit.shards.features import PROMPT_KEY
from datakit.shards.index import FRAME_KEY
from datakit.shards.names import SHARD_PATTERN
from datakit.shards.writer import FrameWriter


class FeatureWriter(FrameWriter):
    """Tar members of tensors (any dtype; bfloat16 stored as its `<u2` bits)."""

    def tensor(self, name: str, t: torch.Tensor) -> int:
        """Write `t` as `name` (.npy); returns the offset of its data."""
        t = t.detach().to("cpu").contiguous()
        arr = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        return self._npy(name, arr)

    def json(self, name: str, meta: dict) -> None:
        self._member(name, [json.dumps(meta, sort_keys=True).encode()])


@dataclass
class ClipSource:
    """Where a worker reads clips: the source folder's reader and the camera, or the slots of a
    tiled canvas (`cfg.tile`) with the loader's normaliser that builds it on the device."""

    reader: ShardReader
    cameras: tuple[str, ...]  # the one camera, or the canvas's slots in canvas order
    norm: Normaliser | None = None  # tiled only

    @classmethod
    def open(cls, reader: ShardReader, cameras: tuple[str, ...], cfg: EncodeConfig, device: str) -> "ClipSource":
        norm = canvas_normaliser(reader.index, cameras, cfg.tile, cfg.cell, device) if cfg.tile else None
        return cls(reader, tuple(cameras), norm)

    def frames(self, clip: Clip, cfg: EncodeConfig) -> np.ndarray:
        """(T, H, W, 3) uint8: the clip's frames of the one camera at its stride."""
        return np.stack([self.reader.read_frame(clip.episode_index, clip.start + k * cfg.stride, self.cameras[0])
                         for k in range(cfg.frames)])

    def vae_input(self, clips: list[Clip], cfg: EncodeConfig,
                  device: torch.device) -> tuple[torch.Tensor, list[np.ndarray]]:
        """((N, 3, T, H, W) float32 in [-1, 1] on `device`, each clip's first frame as (H, W, 3) uint8
        for CLIP): one camera resized bilinearly (`to_vae_input`, CLIP sees the stored frame), or the
        loader's tiled canvas (`canvas.py`, CLIP sees the canvas's first frame rounded to 8 bits)."""
        if self.norm is None:
            raw = torch.from_numpy(np.stack([self.frames(c, cfg) for c in clips]))
            return to_vae_input(raw.to(device), cfg.size), [raw[k, 0].numpy() for k in range(len(clips))]
        x = tiled_clips(self.norm, read_views(self.reader, self.cameras, clips, cfg.frames, cfg.stride))
        return x, [canvas_frame_u8(x[k, :, 0]) for k in range(len(clips))]


def clip_fields(cfg: EncodeConfig) -> list[str]:
    """The per-clip tensors this run stores, in member order."""
    return ["latents"] + (["cond_latents"] if cfg.cond == "first-frame" else []) + \
        (["image"] if cfg.image_encoder is not None else [])


def commit_shard(out: Path, shard: OutputShard, j: FeatureJournal) -> None:
    """Rename the finished shard into place, then its journal (what a rerun keeps); trainkit's
    `encode-backbone` commits its shards here too."""
    shard.commit()
    try:
        write_journal(out, j)
    except OSError as e:
        raise output_error(journal_path(out, j.index), e) from e


def encode_clips(enc: Encoders, src: ClipSource, cfg: EncodeConfig, out: Path, index: int, clips: list[Clip],
                 progress: Callable[[int], None]) -> FeatureJournal:
    """Encode and commit the feature shard `index` of `clips`."""
    shard = OutputShard(Path(out) / SHARD_PATTERN.format(index=index))
    w = FeatureWriter(shard)
    offsets: list[dict[str, int]] = []
    try:
        for b in range(0, len(clips), cfg.batch):
            group = clips[b : b + cfg.batch]
            x, first = src.vae_input(group, cfg, enc.device)  # resized (and tiled) where the VAE runs
            lat = enc.latents(x)
            cond = enc.first_frame_cond(x) if cfg.cond == "first-frame" else None
            for k, c in enumerate(group):
                key = FRAME_KEY.format(episode=c.episode_index, frame=c.start)
                offs = {"latents": w.tensor(f"{key}.latents.npy", lat[k])}
                if cond is not None:
                    offs["cond_latents"] = w.tensor(f"{key}.cond_latents.npy", cond[k])
                if enc.image is not None:
                    offs["image"] = w.tensor(f"{key}.image.npy", enc.image_features(first[k]))
                w.json(f"{key}.json", {"episode_index": c.episode_index, "start": c.start, "stride": cfg.stride,
                                       "frames": cfg.frames, "task_index": c.task_index})
                offsets.append(offs)
            progress(len(group))
        nbytes, sha = shard.finish()
    except BaseException:
        shard.abort()
        raise
    j = FeatureJournal(index, shard.path.name, nbytes, sha, [[c.episode_index, c.start] for c in clips], offsets, [])
    commit_shard(out, shard, j)
    return j


def encode_prompts(enc: Encoders, out: Path, index: int, prompts: list[str],
                   progress: Callable[[int], None]) -> FeatureJournal:
    """Encode each distinct prompt once into the text shard `index` and commit it."""
    shard = OutputShard(Path(out) / SHARD_PATTERN.format(index=index))
    w = FeatureWriter(shard)
    offsets, tokens = [], []
    try:
        for p, text in enumerate(prompts):
            emb = enc.text_embedding(text)
            offsets.append({"text": w.tensor(f"{PROMPT_KEY.format(prompt=p)}.text.npy", emb)})
            tokens.append(int(emb.shape[0]))
            progress(1)
        nbytes, sha = shard.finish()
    except BaseException:
        shard.abort()
        raise
    j = FeatureJournal(index, shard.path.name, nbytes, sha, [[t] for t in prompts], offsets, tokens)
    commit_shard(out, shard, j)
    return j

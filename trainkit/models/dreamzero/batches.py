"""What `dreamzero` needs from datakit.loader: its loader preset (`dreamzero_config`, and
`loader_config` at a model config's shapes: a 33-frame clip of three views
tiled into one canvas on the device, the last states, the actions of the blocks), and the batch
adapter that adds the host-side extras and builds `DreamZeroBatch` on the device.

Host side, per batch (from the batch's own CPU generator, seeded by the trainer from the batch's
position, so the same on any device and after a resume): the text tokens of the task (its UTF-8
bytes + 1, padded with 0 to text_len), the flow noise of the noisy latent frames and of the
actions, and one flow time per action block, t ~ U(0.001, 0.999). Device side: the canvas frames,
state and actions zero-padded to the model's channels, the actions split into their blocks.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from datakit.loader import LoaderConfig, Normaliser
from datakit.loader.slots import view_sizes
from datakit.shards.features import FeatureIndex
from datakit.shards.index import ShardIndex
from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.model import DreamZeroBatch
from trainkit.errors import DataError, ModelConfigError
from trainkit.models.family import HostBatch


def dreamzero_config(**kw: Any) -> LoaderConfig:
    """DreamZero-shaped samples: a 33-frame clip ending at t, and the actions ahead of it. Pass
    `slots=(wrist, exterior_1, exterior_2)` with `tile="wrist_top"` for its one 352x640 canvas from
    three 176x320 views (datakit/loader/tiling.py); tiling keeps every slot (`prune_slots=False`)."""
    kw = {"frame_offsets": tuple(range(-32, 1)), "action_horizon": 32, **kw}
    if kw.get("tile") is not None:
        kw.setdefault("prune_slots", False)
    return LoaderConfig(**kw)


def loader_config(cfg: DreamZeroConfig, index: ShardIndex | None, **kw: Any) -> LoaderConfig:
    """`dreamzero_config` at this model's shapes: `cfg.frames` frames ending at t, the last
    `state_tokens` states, `cfg.horizon` actions, the three slots tiled "wrist_top" (slot 0 the
    wrist view) and every view stretched to `cfg.view` (its canvas cell) on the device, each from its
    own stored size, before tiling: cameras of different sizes make one canvas.
    `kw`: the trainer's loader settings; slot pruning is off (each view keeps its canvas place).
    Without the shard index (`trainkit inspect` with no shards) empty `data.slots` stay empty (the
    loader takes the index's cameras, which must then be 3) and the views' stored size is unknown:
    the resize is kept."""
    slots = tuple(kw.pop("slots", None) or (index.cameras if index is not None else ()))
    if len(slots) not in ((0, 3) if index is None else (3,)):
        raise ModelConfigError(f"data.slots: dreamzero tiles 3 views (wrist, exterior, exterior) into one canvas; "
                               f"got {len(slots)} slot(s) {list(slots)}")
    stored = set(view_sizes(index, slots).values()) if index is not None else {None}
    resize = None if stored <= {cfg.view} else cfg.view
    kw["prune_slots"] = False
    return dreamzero_config(slots=slots, tile="wrist_top", frame_offsets=tuple(range(1 - cfg.frames, 1)),
                            state_offsets=tuple(range(1 - cfg.state_tokens, 1)), action_horizon=cfg.horizon,
                            resize=resize, **kw)


def task_tokens(task: str, length: int) -> torch.Tensor:
    """(length,) int64: the task's UTF-8 bytes + 1, cut or padded with 0 to `length`."""
    ids = [b + 1 for b in task.encode()[:length]]
    return torch.tensor(ids + [0] * (length - len(ids)), dtype=torch.int64)


class DreamZeroBatches:
    """The `dreamzero` batch adapter (trainkit.models.family.BatchAdapter)."""

    def __init__(self, cfg: DreamZeroConfig, index: ShardIndex, normaliser: Normaliser):
        self.cfg = cfg
        self.tokens = torch.stack([task_tokens(t, cfg.text_len) for t in index.tasks]) if index.tasks else \
            torch.zeros((1, cfg.text_len), dtype=torch.int64)

    def flow_draws(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        """The flow noise of the noisy latent frames and of the actions, and one time per block."""
        c = self.cfg
        b = hb["action"].shape[0]
        video_noise = torch.randn((b, c.blocks * c.frames_per_block, c.tokens_per_frame, c.patch_channels),
                                  generator=generator)
        action_noise = torch.randn((b, c.blocks, c.actions_per_block, c.action_dim), generator=generator)
        time = torch.rand((b, c.blocks), generator=generator) * 0.998 + 0.001
        return {"video_noise": video_noise, "action_noise": action_noise, "time": time}

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        return {**hb, "tokens": self.tokens[hb["task_index"]], **self.flow_draws(hb, generator)}

    def model_batch(self, b: HostBatch) -> DreamZeroBatch:
        c = self.cfg
        state, actions = b["state"].float(), b["action"].float()
        if state.shape[-1] > c.state_dim or actions.shape[-1] > c.action_dim:
            raise ModelConfigError(f"the shards have {state.shape[-1]} state / {actions.shape[-1]} action channels; "
                                   f"the model takes at most {c.state_dim} / {c.action_dim} (model.state_dim, "
                                   "model.action_dim)")
        state = F.pad(state, (0, c.state_dim - state.shape[-1]))
        actions = F.pad(actions, (0, c.action_dim - actions.shape[-1]))
        return DreamZeroBatch(video=b["images"][:, 0], tokens=b["tokens"], state=state,
                              actions=actions.view(-1, c.blocks, c.actions_per_block, c.action_dim),
                              video_noise=b["video_noise"], action_noise=b["action_noise"], time=b["time"])


def check_features(cfg: DreamZeroConfig, index: FeatureIndex, where: str) -> None:
    """A feature folder fits this model, or DataError naming the folder's index.json with both sides:
    the clip length, the frame size and the latent shape the model's config implies against the
    folder's fingerprint and fields; the cached embeddings' widths against the model's."""
    fp = index.fingerprint
    lat = index.fields["latents"].shape
    sf = index.vae.get("scale_factor_spatial", cfg.vae_stride[1])
    size = fp.get("size") or [lat[2] * sf, lat[3] * sf]
    checks = [("clip frames", cfg.frames, fp.get("frames"), "model.frames"),
              ("frame size", list(cfg.canvas), size, "model.view (x2: the canvas)"),
              ("latent shape", [cfg.latent_channels, cfg.latent_frames, *cfg.latent_hw], lat,
               "model.latent_channels, frames, view, vae_stride")]
    if "image" in index.fields:
        checks.append(("image features", [cfg.image_tokens, cfg.image_width], index.fields["image"].shape,
                       "model.image_grid, image_width"))
    if index.text_width:
        checks.append(("text width", cfg.text_width, index.text_width, "model.text_width"))
    for what, want, have, fields in checks:
        if (list(have) if isinstance(have, (list, tuple)) else have) != want:
            raise DataError(f"{where.rstrip('/')}/index.json", f"{what} {have} (fingerprint of `datakit encode`) "
                            f"differs from the run's {want} ({fields}); encode again for this model, or change it")
    if cfg.horizon > index.span:
        raise DataError(f"{where.rstrip('/')}/index.json", f"clips span {index.span} frames of actions; the model "
                        f"takes {cfg.horizon} (model.actions_per_block x blocks)")


class DreamZeroFeatureBatches(DreamZeroBatches):
    """The `dreamzero` batch adapter on a feature folder: cached latents, text and image features in
    place of the stand-ins' inputs; the same flow noise and time as on frames."""

    def __init__(self, cfg: DreamZeroConfig, index: FeatureIndex, where: str):
        check_features(cfg, index, where)
        self.cfg = cfg

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        return {**hb, **self.flow_draws(hb, generator)}  # no text tokens: the text is cached

    def model_batch(self, b: HostBatch) -> DreamZeroBatch:
        c = self.cfg
        state = b["state"].float()[:, None].expand(-1, c.state_tokens, -1)  # the clip's first state, per token
        actions = b["action"].float()[:, : c.horizon]
        state = F.pad(state, (0, c.state_dim - state.shape[-1]))
        actions = F.pad(actions, (0, c.action_dim - actions.shape[-1]))
        text, image = b.get("text"), b.get("image")
        if image is None:  # encoded without an image encoder: no image context (zeros)
            image = torch.zeros((state.shape[0], c.image_tokens, c.image_width), device=state.device)
        if text is not None:  # zero-padded (or cut) to the model's text context, as Wan pads umT5's output
            text = F.pad(text[:, : c.text_len], (0, 0, 0, max(0, c.text_len - text.shape[1])))
        return DreamZeroBatch(video=None, tokens=None if text is not None else torch.zeros(
                                  (state.shape[0], c.text_len), dtype=torch.int64, device=state.device),
                              state=state, actions=actions.reshape(-1, c.blocks, c.actions_per_block, c.action_dim),
                              video_noise=b["video_noise"], action_noise=b["action_noise"], time=b["time"],
                              latents=b["latents"], text=text, image=image)

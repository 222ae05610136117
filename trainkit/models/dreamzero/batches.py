"""What `dreamzero` needs from datakit.loader: its loader preset (`dreamzero_config`, and
`loader_config` at a model config's shapes: a 33-frame clip of three views tiled into one canvas on
the device, the last states, the actions of the blocks), and the batch adapter that adds the
host-side extras and builds `DreamZeroBatch` (features) on the device.

Host side, per batch (from the batch's own CPU generator, seeded by the trainer from the batch's
position, so the same on any device and after a resume): the text tokens of the task (its UTF-8
bytes + 1, padded with 0 to text_len), the flow noise of the latents and of the actions, and one
step id of the discrete schedule per latent frame (schedule.py: uniform over 0..999, a block's
frames sharing the id of its first), as its sigma and training weight. Device side: the frame
path's stand-in features (standin.py: latents, text and CLIP features from the frames), the state
and actions zero-padded to the model's channels with the action mask (real channels, not padding
past the episode's end).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from datakit.loader import LoaderConfig
from datakit.loader.slots import view_sizes
from datakit.shards.index import ShardIndex
from trainkit.models.dreamzero import schedule
from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.model import DreamZeroBatch
from trainkit.models.dreamzero.standin import StandIns, first_frame_cond
from trainkit.errors import ModelConfigError
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


def flow_extras(cfg: DreamZeroConfig, b: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The flow-matching draws of `b` samples: noise of the latents and actions, each frame's sigma
    and training weight (schedule.py), in this order from `generator`."""
    h, w = cfg.latent_hw
    noise = torch.randn((b, cfg.latent_channels, cfg.latent_frames, h, w), generator=generator)
    action_noise = torch.randn((b, cfg.horizon, cfg.action_dim), generator=generator)
    ids = schedule.block_ids(torch.randint(0, cfg.train_timesteps, (b, cfg.latent_frames), generator=generator),
                             cfg.frames_per_block)
    sigma = schedule.sigmas(cfg.train_timesteps, cfg.shift)[ids].float()
    weight = schedule.weights(cfg.train_timesteps, cfg.shift)[ids].float()
    return {"noise": noise, "action_noise": action_noise, "sigma": sigma, "weight": weight}


class DreamZeroBatches:
    """The `dreamzero` batch adapter (trainkit.models.family.BatchAdapter) for frame shards."""

    def __init__(self, cfg: DreamZeroConfig, index: ShardIndex, loader: LoaderConfig):
        self.cfg = cfg
        self.tokens = torch.stack([task_tokens(t, cfg.text_len) for t in index.tasks]) if index.tasks else \
            torch.zeros((1, cfg.text_len), dtype=torch.int64)
        self.standins = StandIns(cfg)

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        return {**hb, "tokens": self.tokens[hb["task_index"]], **flow_extras(self.cfg, hb["action"].shape[0], generator)}

    def model_batch(self, b: HostBatch) -> DreamZeroBatch:
        c = self.cfg
        state, actions = b["state"].float(), b["action"].float()
        if state.shape[-1] > c.state_dim or actions.shape[-1] > c.action_dim:
            raise ModelConfigError(f"the shards have {state.shape[-1]} state / {actions.shape[-1]} action channels; "
                                   f"the model takes at most {c.state_dim} / {c.action_dim} (model.state_dim, "
                                   "model.action_dim)")
        real = torch.arange(c.action_dim, device=actions.device) < actions.shape[-1]
        action_mask = (real[None, None, :] & ~b["action_is_pad"][:, :, None]).float()
        video = b["images"][:, 0]
        latents = self.standins.latents(video)
        cond = first_frame_cond(latents, None) if c.first_frame_concat else latents[:, :0]
        return DreamZeroBatch(latents=latents, cond=cond, text=self.standins.text_features(b["tokens"]),
                              image=self.standins.image_features(video[:, 0]),
                              state=F.pad(state, (0, c.state_dim - state.shape[-1])),
                              actions=F.pad(actions, (0, c.action_dim - actions.shape[-1])), action_mask=action_mask,
                              noise=b["noise"], action_noise=b["action_noise"], sigma=b["sigma"], weight=b["weight"])

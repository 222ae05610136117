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

From a feature folder (`datakit encode`, `DreamZeroFeatureBatches`) the same host draws, and on the
device the cached features: latents (and Wan2.1-I2V's first-frame conditioning latents) normalised
as Wan's VAE wrapper does, (z - latents_mean) / latents_std from the folder's VAE record; umT5 text
zeroed past each prompt and zero-padded to text_len (Wan's padding); CLIP features as cached. No
encoder runs in the step.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from datakit.loader import LoaderConfig, Normaliser
from datakit.loader.slots import view_sizes
from datakit.shards.features import FeatureIndex
from datakit.shards.index import ShardIndex
from trainkit.models.dreamzero import schedule
from trainkit.models.dreamzero.config import DreamZeroConfig
from trainkit.models.dreamzero.model import DreamZeroBatch
from trainkit.models.dreamzero.standin import StandIns, first_frame_cond
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

    def __init__(self, cfg: DreamZeroConfig, index: ShardIndex, normaliser: Normaliser):
        self.cfg = cfg
        self.tokens = torch.stack([task_tokens(t, cfg.text_len) for t in index.tasks]) if index.tasks else \
            torch.zeros((1, cfg.text_len), dtype=torch.int64)
        self.standins = StandIns(cfg)

    # said once at launch (BatchAdapter.note): frames train against fixed random maps, not the encoders
    note = ("dreamzero on frame shards trains with stand-in encoders (fixed random maps in place of the VAE, umT5 "
            "and CLIP: trainkit/models/dreamzero/standin.py); for real features encode the shards first "
            "(datakit encode, docs/encode.md) and train on the feature folder")

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


def check_features(cfg: DreamZeroConfig, index: FeatureIndex, where: str) -> None:
    """A feature folder fits this model, or DataError naming the folder's index.json with both sides:
    the clip length, the frame size and the latent shape the model's config implies against the
    folder's fingerprint and fields; the cached embeddings' widths against the model's; Wan2.1-I2V's
    conditioning latents when the model concatenates them; first, the tiling: the model trains on
    the "wrist_top" canvas of 3 views (`datakit encode --slots ... --tile wrist_top`), not one camera."""
    fp = index.fingerprint
    if fp.get("tile") != "wrist_top":
        have = f"{fp['tile']} of {fp.get('slots')}" if fp.get("tile") else f"none (one camera, {fp.get('camera')})"
        raise DataError(f"{where.rstrip('/')}/index.json", f"tiling {have} (fingerprint of `datakit encode`) differs "
                        "from the run's wrist_top of 3 views (dreamzero's canvas); encode again with --slots "
                        "WRIST,EXTERIOR_1,EXTERIOR_2 --tile wrist_top")
    lat = index.fields["latents"].shape
    sf = index.vae.get("scale_factor_spatial", cfg.vae_stride[1])
    size = fp.get("size") or [lat[2] * sf, lat[3] * sf]
    checks = [("clip frames", cfg.frames, fp.get("frames"), "model.frames"),
              ("frame size", list(cfg.canvas), list(size), "model.view (x2: the canvas)"),
              ("latent shape", [cfg.latent_channels, cfg.latent_frames, *cfg.latent_hw], list(lat),
               "model.latent_channels, frames, view, vae_stride")]
    if "image" in index.fields:
        checks.append(("image features", [cfg.image_tokens, cfg.image_width], list(index.fields["image"].shape),
                       "model.image_grid, image_width"))
    if index.text_width:
        checks.append(("text width", cfg.text_width, index.text_width, "model.text_width"))
    checks.append(("first-frame conditioning", cfg.first_frame_concat, "cond_latents" in index.fields,
                   "model.first_frame_concat (datakit encode --cond first-frame)"))
    for what, want, have, fields in checks:
        if want != have:
            raise DataError(f"{where.rstrip('/')}/index.json", f"{what} {have} (fingerprint of `datakit encode`) "
                            f"differs from the run's {want} ({fields}); encode again for this model, or change it")
    if cfg.horizon > index.span:
        raise DataError(f"{where.rstrip('/')}/index.json", f"clips span {index.span} frames of actions; the model "
                        f"takes {cfg.horizon} (model.actions_per_block x blocks)")


class DreamZeroFeatureBatches:
    """The `dreamzero` batch adapter on a feature folder (module docstring)."""

    def __init__(self, cfg: DreamZeroConfig, index: FeatureIndex, where: str):
        check_features(cfg, index, where)
        self.cfg = cfg
        c = cfg.latent_channels
        self.mean = torch.tensor(index.vae.get("latents_mean") or [0.0] * c, dtype=torch.float32)
        self.inv_std = 1 / torch.tensor(index.vae.get("latents_std") or [1.0] * c, dtype=torch.float32)

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        return {**hb, **flow_extras(self.cfg, hb["action"].shape[0], generator)}

    def _normalised(self, z: torch.Tensor) -> torch.Tensor:
        shape = (1, -1, 1, 1, 1)
        return (z.float() - self.mean.to(z.device).view(shape)) * self.inv_std.to(z.device).view(shape)

    def model_batch(self, b: HostBatch) -> DreamZeroBatch:
        c = self.cfg
        state, actions = b["state"].float(), b["action"].float()[:, : c.horizon]
        if state.shape[-1] > c.state_dim or actions.shape[-1] > c.action_dim:
            raise ModelConfigError(f"the features have {state.shape[-1]} state / {actions.shape[-1]} action "
                                   f"channels; the model takes at most {c.state_dim} / {c.action_dim}")
        n, device = state.shape[0], state.device
        state = F.pad(state, (0, c.state_dim - state.shape[-1]))[:, None].expand(-1, c.state_tokens, -1)
        real = torch.arange(c.action_dim, device=device) < actions.shape[-1]
        action_mask = real[None, None, :].expand(n, c.horizon, -1).float()
        latents = self._normalised(b["latents"])
        cond = first_frame_cond(latents, self._normalised(b["cond_latents"]) if "cond_latents" in b else None) \
            if c.first_frame_concat else latents[:, :0]
        text = torch.zeros((n, c.text_len, c.text_width), device=device)
        if "text" in b:  # real tokens only, cut or zero-padded to the model's context (Wan's padding)
            t = (b["text"].float() * b["text_mask"][..., None])[:, : c.text_len]
            text[:, : t.shape[1]] = t
        image = b["image"].float() if "image" in b else torch.zeros((n, c.image_tokens, c.image_width), device=device)
        return DreamZeroBatch(latents=latents, cond=cond, text=text, image=image, state=state,
                              actions=F.pad(actions, (0, c.action_dim - actions.shape[-1])), action_mask=action_mask,
                              noise=b["noise"], action_noise=b["action_noise"], sigma=b["sigma"], weight=b["weight"])

"""What `gr00t` needs from datakit.loader: its loader preset (`gr00t_config`, and `loader_config` at
the model's shapes), and the batch adapter that adds the host-side extras and builds `Gr00tBatch`
on the device.

Host side, per batch: the prompt tokens (QwenChatTokenizer: the chat turn with each kept slot's
image run, N1.7's layout; the checkpoint's tokenizer files, `model.tokenizer`, or the builtin
byte-level stand-in), and the flow noise and time and the state
dropout draw (which samples lose their state features in training), drawn from
the batch's own CPU generator (seeded by (seed, loader epoch, loader step, rank), so they are the
same on any device, with any number of workers, after a resume, and outside a CUDA graph that
replays the step). Device side: the newest frame of each kept slot, the current state and the
action chunk zero-padded to the model's channels, and the loss mask (real channels of real steps).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from datakit.loader import LoaderConfig, Normaliser
from datakit.loader.slots import view_sizes
from datakit.shards.index import ShardIndex
from trainkit.errors import ModelConfigError
from trainkit.models.family import HostBatch
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.model import Gr00tBatch, sample_flow
from trainkit.models.gr00t.chat_tokenizer import QWEN_IDS, SPECIAL, QwenChatTokenizer


def gr00t_config(**kw: Any) -> LoaderConfig:
    """GR00T-N1.7-shaped samples: the current frame of each slot (2-3 cameras), the current state,
    40 future actions with their pad mask (`action_is_pad`), quantile norm; `loader_config` adds the
    model's view transform on the device."""
    return LoaderConfig(**{"frame_offsets": (0,), "state_offsets": (0,), "action_horizon": 40, "norm": "quantile",
                           **kw})


N17_CROP_FRACTION = 230 / 256  # LeRobot 0.6.1's N1_7_DEFAULT_IMAGE_CROP_SIZE / N1_7_DEFAULT_IMAGE_TARGET_SIZE


def n17_view_settings(size: tuple[int, int], *, crop_fraction: float = N17_CROP_FRACTION,
                      random_crop: bool = False) -> dict[str, Any]:
    """LoaderConfig settings of GR00T N1.7's view transform (LeRobot 0.6.1's
    `_transform_n1_7_image_for_vlm_torch`, run on the device by datakit's normaliser): each view
    bicubic (antialiased, whole uint8 levels) to `size`, the centre crop of `crop_fraction` of each
    side (230 of 256; sizes rounded, offsets floored), bicubic back to `size`, then (x / 255 - 0.5) / 0.5
    (Qwen3-VL's image mean and std). `random_crop`: the training augmentation of Isaac-GR00T and of
    LeRobot's albumentations path: the window at a random place per sample (the same for its
    views), a pure function of (seed, epoch, the sample's row); LeRobot's default transform has
    none, and that path resizes with OpenCV's area filter, not bicubic. N1.7's size is square
    (256 x 256): LeRobot's first resize goes to (H, H), the same only then."""
    crop = tuple(max(1, round(side * crop_fraction)) for side in size)
    view = dict(resize=tuple(size), resize_mode="bicubic", image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    if crop == tuple(size):
        return view
    return {**view, "crop": crop, "crop_resize": True, "random_crop": random_crop, "crop_per_sample": random_crop}


def view_settings(cfg: Gr00tConfig) -> dict[str, Any]:
    """LoaderConfig settings of the model's view transform (`cfg.view_transform`): "n17": N1.7's
    (`n17_view_settings` at the model's view size, `cfg.random_crop` moving the window per sample);
    "resize": each view bilinear (antialiased) to the view size, no crop."""
    size = (cfg.image_height, cfg.image_width)
    if cfg.view_transform == "n17":
        return n17_view_settings(size, random_crop=cfg.random_crop)
    return {"resize": size}


def eval_crop(cfg: Gr00tConfig) -> tuple[int, int] | None:
    """The (H, W) centre crop of the model's view transform at evaluation (None: no crop): what an
    export tells a serving stack to crop."""
    return view_settings(cfg).get("crop")


def loader_config(cfg: Gr00tConfig, index: ShardIndex | None, **kw: Any) -> LoaderConfig:
    """`gr00t_config` at this model's shapes: `cfg.horizon` actions, each camera view brought to
    (image_height, image_width) on the device by the model's view transform (`view_settings`; N1.7
    trains every view at 256x256, whatever the camera's aspect ratio). `kw`: the trainer's loader
    settings. A transform without a crop drops its resize when the index says every camera is
    stored at the view size; without the shard index (`trainkit inspect` with no shards) it is kept."""
    size, view = (cfg.image_height, cfg.image_width), view_settings(cfg)
    if index is not None and "crop" not in view and set(view_sizes(index, kw.get("slots") or ()).values()) <= {size}:
        view = {**view, "resize": None}
    return gr00t_config(action_horizon=cfg.horizon, **view, **kw)


def chat_tokenizer(cfg: Gr00tConfig) -> QwenChatTokenizer:
    """The model's prompt tokenizer: `cfg.tokenizer`'s files, else the builtin stand-in (at Qwen's
    special-token ids when the model's <|image_pad|> is Qwen's). ModelConfigError (one line) when its
    special tokens are not the model's embedding rows."""
    if cfg.tokenizer:
        tok = QwenChatTokenizer.from_folder(cfg.tokenizer, tokens_per_image=cfg.tokens_per_image,
                                            text_len=cfg.text_len)
    else:
        tok = QwenChatTokenizer.builtin(tokens_per_image=cfg.tokens_per_image, text_len=cfg.text_len,
                                        qwen_ids=cfg.image_token_id == QWEN_IDS[SPECIAL.index("<|image_pad|>")])
    where = cfg.tokenizer or "the builtin tokenizer"
    for token, field in (("<|image_pad|>", "image_token_id"), ("<|vision_start|>", "vision_start_id"),
                         ("<|vision_end|>", "vision_end_id")):
        if tok.tokenizer.token_to_id(token) != getattr(cfg, field):
            raise ModelConfigError(f"{where}: its {token} is id {tok.tokenizer.token_to_id(token)}, the model's "
                                   f"{field} is {getattr(cfg, field)}: set model.{field} to the tokenizer's")
    rows = max(tok.tokenizer.get_vocab(with_added_tokens=True).values()) + 1
    if rows > cfg.vocab:
        raise ModelConfigError(f"{where}: its ids reach {rows - 1}, beyond the model's vocab {cfg.vocab}")
    return tok


class Gr00tBatches:
    """The `gr00t` batch adapter (trainkit.models.family.BatchAdapter)."""

    def __init__(self, cfg: Gr00tConfig, index: ShardIndex, normaliser: Normaliser):
        self.cfg = cfg
        self.tasks = list(index.tasks)
        self.tokenizer = chat_tokenizer(cfg)
        self.tokenizer.prepare(list(range(1, cfg.max_slots + 1)))  # at launch: every number of views a batch may have

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        """Prompt tokens and flow noise/time (small tensors, copied with the batch)."""
        b, c = hb["action"].shape[0], self.cfg
        views = hb["image_mask"].shape[1]  # every sample carries each kept slot's run (a missing camera's too)
        tokens, token_mask = self.tokenizer.encode([self.tasks[i] for i in hb["task_index"].tolist()], views,
                                                   views * (c.tokens_per_image + 2) + c.text_len if c.fixed_len else None)
        noise, time = sample_flow(torch.zeros((b, c.horizon, c.action_dim)), generator)
        state_drop = torch.rand((b,), generator=generator) < c.state_dropout  # as LeRobot's torch.rand(B) < p
        return {**hb, "tokens": tokens, "token_mask": token_mask, "noise": noise, "time": time,
                "state_drop": state_drop}

    def model_batch(self, b: HostBatch) -> Gr00tBatch:
        c = self.cfg
        actions, state = b["action"].float(), b["state"][:, -1].float()
        if actions.shape[-1] > c.action_dim or state.shape[-1] > c.state_dim:
            raise ModelConfigError(f"the dataset's {actions.shape[-1]} action / {state.shape[-1]} state channels exceed "
                                   f"model.action_dim {c.action_dim} / model.state_dim {c.state_dim}")
        real = (torch.arange(c.action_dim, device=actions.device) < actions.shape[-1])[None]  # (1, A)
        if "action_mask" in b:  # a mixture: each item's own source's channels (the rest is padding)
            real = F.pad(b["action_mask"], (0, c.action_dim - actions.shape[-1]))  # (B, A)
        action_mask = real[:, None, :] & ~b["action_is_pad"][:, :, None]
        return Gr00tBatch(images=b["images"][:, :, -1], image_mask=b["image_mask"], tokens=b["tokens"],
                          token_mask=b["token_mask"], state=F.pad(state, (0, c.state_dim - state.shape[-1])),
                          actions=F.pad(actions, (0, c.action_dim - actions.shape[-1])), action_mask=action_mask,
                          noise=b["noise"], time=b["time"], state_drop=b["state_drop"])

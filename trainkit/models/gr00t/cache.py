"""Training GR00T's head from a cached backbone: what a cached sample holds and what ties a cache to
a model (`FROZEN_CACHE`, the family's `FrozenCache` record that `trainkit encode-backbone` runs:
trainkit/predict/encode_backbone.py), and the batch adapter that reads one (`Family.feature_batches`);
docs/gr00t.md "Training the head from a cached backbone".

A cached sample: `vl` (T, lm_width) in the run's compute dtype, the LLM's output at select_layer
before any trained layer (`Gr00t.vl_features`' first value), and `vl_masks` (3, T) uint8 (image
token, valid, seen), with T = fixed_len's views x (tokens_per_image + 2) + text_len; the driver adds
the action chunk's pad mask, and state and action go in the clip table as raw values.

Why the cache is valid at all: N1.7 trains with the ViT and the LLM up to select_layer frozen and
under no_grad (model.py), and with N1.7's deterministic view transform (bicubic, centre crop,
bicubic back), so a sample's VL features are a pure function of (backbone weights, view transform,
its frames, its prompt tokens). Three settings break that and are refused (`check_model_config`):
`lm_trained` > 0 (LLM layers inside the cut train), `random_crop` (the crop moves every epoch: the
augmentation the cache removes) and `fixed_len` off (the padded length follows the batch, and the
VL self-attention sees the padding).

The fingerprint (`cache_fingerprint`) names the backbone's weights by digest (sha256 over its
frozen tensors in the dtype the backbone ran in: a checkpoint and a seeded init alike), its shapes
and select_layer, the view transform, the slots, the tokenizer, the dtype and the source shards'
identity; the trainer refuses a cache whose fingerprint differs from the run's, one line naming
the first key that differs (`check_features` at open, `Gr00tFeatureBatches.check` once the
weights are loaded).
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from datakit.durable import file_sha256
from datakit.encode.run import fingerprint_diff
from datakit.shards.features import FeatureIndex
from trainkit.errors import DataError, ModelConfigError
from trainkit.models.family import FrozenCache, HostBatch
from trainkit.models.gr00t.batches import view_settings
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.flops import cached_flops_per_sample
from trainkit.models.gr00t.model import Gr00tCachedBatch, sample_flow

BACKBONE_MODULES = ("visual", "vision_blocks", "embed", "lm_frozen")  # what runs offline (frozen, no_grad)


def check_model_config(cfg: Gr00tConfig) -> None:
    """ModelConfigError (one line, every setting to change at once) when the cache cannot equal what
    the model would compute."""
    wrong = []
    if cfg.lm_trained:
        wrong.append(f"model.lm_trained = {cfg.lm_trained} trains LLM layers inside the cached select_layer "
                     f"output: set model.lm_trained = 0")
    if cfg.random_crop:
        wrong.append("model.random_crop moves each view's crop per sample (the image augmentation caching "
                     "removes): set model.random_crop = false")
    if not cfg.fixed_len:
        wrong.append("each sample's padded sequence is stored, and without fixed_len the padded length follows "
                     "the batch (the VL self-attention sees it): set model.fixed_len = true")
    if wrong:
        raise ModelConfigError("a cached backbone cannot hold what this config computes: " + "; ".join(wrong))


def sequence_len(cfg: Gr00tConfig, slots: int) -> int:
    """Tokens of every cached sample: fixed_len's views x (tokens_per_image + 2) + text_len."""
    return slots * (cfg.tokens_per_image + 2) + cfg.text_len


def model_part(cfg: Gr00tConfig) -> dict[str, Any]:
    """The fingerprint's words on the model: what decides the backbone's output besides its weights."""
    shapes = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg.backbone).items()}
    return {"select_layer": cfg.lm_depth, "backbone_shapes": shapes, "tokens_per_image": cfg.tokens_per_image,
            "text_len": cfg.text_len, "special_ids": [cfg.image_token_id, cfg.vision_start_id, cfg.vision_end_id],
            "view": {k: list(v) if isinstance(v, tuple) else v for k, v in view_settings(cfg).items()},
            "tokenizer": file_sha256(Path(cfg.tokenizer) / "tokenizer.json") if cfg.tokenizer else "builtin",
            "horizon": cfg.horizon}


@torch.no_grad()
def backbone_digest(model: nn.Module, dtype: torch.dtype) -> str:
    """sha256 over the frozen backbone's tensors (name, shape, bytes at `dtype`), in name order: the
    weights the cache was computed with, whether a checkpoint's or a seeded init's."""
    h = hashlib.sha256()
    for prefix in BACKBONE_MODULES:
        for name, t in sorted(getattr(model, prefix).state_dict().items()):
            t = t.full_tensor() if isinstance(t, DTensor) else t
            t = t.detach().to("cpu", dtype).contiguous()
            h.update(f"{prefix}.{name}\0{list(t.shape)}\0".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_features(cfg: Gr00tConfig, index: FeatureIndex, where: str) -> None:
    """DataError naming the folder's index.json when it is not a GR00T backbone cache for this
    model's shapes, select_layer, view transform and tokenizer."""
    path = f"{where.rstrip('/')}/index.json"
    fp = index.fingerprint
    if fp.get("kind") != "backbone" or fp.get("family") != "gr00t":  # trainkit/predict/encode_backbone.py's CACHE_KIND
        raise DataError(path, "a feature folder of `datakit encode` (DreamZero's clips); GR00T trains from a cached "
                              "backbone (`trainkit encode-backbone`) or from frames")
    check_model_config(cfg)
    why = fingerprint_diff(fp.get("model"), model_part(cfg))
    if why is not None:
        raise DataError(path, f"a backbone cache made for another model ({why}); encode again for this one")


def cache_fields(cfg: Gr00tConfig, slots: int) -> dict[str, tuple[str | None, list[int]]]:
    t = sequence_len(cfg, slots)
    return {"vl": (None, [t, cfg.lm_width]), "vl_masks": ("uint8", [3, t])}


@torch.no_grad()
def run_backbone(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    """The frozen backbone on a `Gr00tBatch`: the cached fields, (B, ...) each."""
    vl, image, valid, seen = model.vl_features(batch)
    return {"vl": vl, "vl_masks": torch.stack([image, valid, seen], dim=1).to(torch.uint8)}


FROZEN_CACHE = FrozenCache(check=check_model_config, describe=model_part, digest=backbone_digest, fields=cache_fields,
                           run=run_backbone)


class Gr00tFeatureBatches:
    """The `gr00t` batch adapter on a cached backbone: the cached VL features and masks, state and
    action from the clip table, and the same flow draws as `Gr00tBatches.extras` from the same
    generator (noise, time, then the state dropout draw), so a cached run sees the frame run's draws.
    `slots` and `flops_per_sample` tell the trainer what a step computes (the head alone)."""

    def __init__(self, cfg: Gr00tConfig, index: FeatureIndex, where: str):
        check_features(cfg, index, where)
        self.cfg, self.where, self.fingerprint = cfg, where, index.fingerprint
        self.slots = len(index.fingerprint["slots"])  # every sample carries each slot's run (StepBatch.slots)
        self.n_image = self.slots * cfg.tokens_per_image
        self.flops_per_sample = cached_flops_per_sample  # the step's work: the backbone ran offline
        self.note = (f"gr00t: the head trains on the cached backbone in {where} (no image augmentation, the backbone "
                     "does not run)")

    def check(self, model: nn.Module, dtype: torch.dtype) -> None:
        """Once the weights are loaded: DataError when the cache was computed in another dtype than the
        run's compute dtype, or with other backbone weights."""
        made = self.fingerprint["dtype"]
        if getattr(torch, made) != dtype:
            raise DataError(f"{self.where.rstrip('/')}/index.json", f"the backbone ran in {made} (fingerprint.dtype); "
                            f"the run computes in {str(dtype).removeprefix('torch.')} (parallel.param_dtype): encode "
                            "again with the run's config")
        have = backbone_digest(model, dtype)
        if have != self.fingerprint.get("backbone"):
            raise DataError(f"{self.where.rstrip('/')}/index.json", f"computed with other backbone weights (digest "
                            f"{str(self.fingerprint.get('backbone'))[:12]}, the run's {have[:12]}: another seed or "
                            "model.init_from); encode again from this run's weights")

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        b, c = hb["action"].shape[0], self.cfg
        noise, time = sample_flow(torch.zeros((b, c.horizon, c.action_dim)), generator)
        state_drop = torch.rand((b,), generator=generator) < c.state_dropout
        return {**hb, "noise": noise, "time": time, "state_drop": state_drop}

    def model_batch(self, b: HostBatch) -> Gr00tCachedBatch:
        c = self.cfg
        actions, state = b["action"].float(), b["state"].float()
        if actions.shape[-1] > c.action_dim or state.shape[-1] > c.state_dim:
            raise ModelConfigError(f"the cache's {actions.shape[-1]} action / {state.shape[-1]} state channels exceed "
                                   f"model.action_dim {c.action_dim} / model.state_dim {c.state_dim}")
        real = (torch.arange(c.action_dim, device=actions.device) < actions.shape[-1])[None]
        action_mask = real[:, None, :] & ~b["action_is_pad"].bool()[:, :, None]
        masks = b["vl_masks"].bool()
        return Gr00tCachedBatch(vl=b["vl"], vl_image=masks[:, 0], valid=masks[:, 1], seen=masks[:, 2],
                                n_image=self.n_image, state=F.pad(state, (0, c.state_dim - state.shape[-1])),
                                actions=F.pad(actions, (0, c.action_dim - actions.shape[-1])), action_mask=action_mask,
                                noise=b["noise"], time=b["time"], state_drop=b["state_drop"])

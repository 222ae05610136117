"""uint8 batch -> model inputs, on whatever device the batch is on (GPU in training, CPU in tests).

Images leave the host as stored uint8 (rgb or nv12) and become normalised NCHW bf16/fp32
here: NV12 -> RGB, optional resize (`loader/resize.py`: "stretch", "bicubic", or Pi0.5's
aspect-preserving "pad") / crop (and back to the resize size: GR00T N1.7) / brightness-contrast jitter, then scale and mean/std as one `addcmul` that reads the
permuted uint8 and writes the output dtype in a single kernel. Cameras of different sizes arrive
one tensor per slot (`slots.slot_images`), a mixture's slot whose sources differ in size one tensor
per size (`slots.slot_groups`); each view is resized to the model's input on its own, and views
that end at one size are stacked into `images` (B, K, T, 3, H, W) again, so a model sees the same
batch whatever sizes the cameras store. State and action are mapped with the index statistics, `x * scale + bias`
(a mixture: each item with its own source's, `from_sources`).
Random choices are pure functions of (seed, epoch, step, row), so a resumed run augments
exactly as the unbroken one did.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from datakit.loader.config import LoaderConfig
from datakit.loader.nv12 import FusedNV12
from datakit.loader.resize import resize_view
from datakit.loader.slots import IMAGES, SlotGroups, is_items_key, is_slot_key, slot_groups, slot_key
from datakit.loader.tiling import tile_views
from datakit.shards.index import ShardIndex
from datakit.stages.colour import nv12_to_rgb_float

_EPS = 1e-8


def affine_from_stats(stats: dict[str, list[float]], mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, bias) with normalised = x * scale + bias, for "mean_std", "quantile" or "none"."""
    if mode == "none":
        n = len(stats["mean"])
        return torch.ones(n), torch.zeros(n)
    if mode == "mean_std":
        scale = 1.0 / torch.tensor(stats["std"], dtype=torch.float64).clamp_min(_EPS)
        bias = -torch.tensor(stats["mean"], dtype=torch.float64) * scale
    else:  # quantile: q01 -> -1, q99 -> +1
        lo, hi = torch.tensor(stats["q01"], dtype=torch.float64), torch.tensor(stats["q99"], dtype=torch.float64)
        scale = 2.0 / (hi - lo).clamp_min(_EPS)
        bias = -1.0 - lo * scale
    return scale.float(), bias.float()


def hash_uniform(x: torch.Tensor, key: int) -> torch.Tensor:
    """Deterministic U[0, 1) per element of an int64 tensor (same bits on CPU and GPU)."""
    z = x.to(torch.int64) * 0x5851F42D4C957F2D + key  # wraps mod 2**64, identically everywhere
    z = z ^ (z >> 29)
    z = z * 0x2545F4914F6CDD1D
    z = z ^ (z >> 32)
    return ((z >> 11) & ((1 << 24) - 1)).to(torch.float32) / float(1 << 24)


CROP, JITTER = 1, 2  # augmentation ids: each draws from its own key


def aug_key(seed: int, epoch: int, augmentation: int) -> int:
    """The hash key of one augmentation in one epoch: splitmix64 of (seed, epoch, augmentation),
    so no two (seed, epoch, augmentation) share a stream (a linear key such as
    seed * c + epoch gave crop and jitter the same key at seed 0, epoch 0)."""
    z = 0
    for part in (seed, epoch, augmentation):
        z = (z + part + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        z ^= z >> 31
    return z & (2**62 - 1)  # room to add to an int64 without overflow


def crop_offsets(seed: int, epoch: int, step: int, rows: int, cols: int) -> tuple[int, int]:
    """(top, left) of a random crop, a pure function of (seed, epoch, step).

    Each (step, axis) hashes its own input (2*step for top, 2*step+1 for left), so no value is
    shared between steps or axes: hashing [step, step+1] made the left offset of step s equal
    the top offset of step s+1."""
    u = hash_uniform(torch.tensor([2 * step, 2 * step + 1]), aug_key(seed, epoch, CROP))
    return int(u[0] * rows), int(u[1] * cols)


def _size_error(sizes: set[tuple[int, ...]]) -> ValueError:
    """A mixture's slot whose size groups stay at different sizes: nothing brings them to one."""
    shown = ", ".join(sorted("x".join(map(str, s)) for s in sizes))
    return ValueError(f"the sources of a mixture store one slot at sizes {shown}: set resize=(H, W) to bring "
                      "each to the model's input")


@dataclass
class Normaliser:
    """The device-side transform of a batch; `to(device)` once, then call per batch."""

    cfg: LoaderConfig
    layout: str  # "rgb" | "nv12" as stored
    image_scale: torch.Tensor  # (3,) 1 / (255 * std)
    image_bias: torch.Tensor  # (3,) -mean / std
    state_affine: tuple[torch.Tensor, torch.Tensor]
    action_affine: tuple[torch.Tensor, torch.Tensor]
    # NV12 with no resize / crop / jitter: colour matrix and scaling folded into two passes
    fused_nv12: FusedNV12 | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        cfg = self.cfg
        if (self.layout == "nv12" and cfg.resize is None and cfg.crop is None and cfg.colour_jitter == 0
                and cfg.tile is None):
            self.fused_nv12 = FusedNV12.of(self.image_scale, self.image_bias)

    @classmethod
    def from_index(cls, index: ShardIndex, cfg: LoaderConfig) -> "Normaliser":
        mean, std = torch.tensor(cfg.image_mean), torch.tensor(cfg.image_std)
        return cls(cfg=cfg, layout=index.layout, image_scale=1.0 / (255.0 * std), image_bias=-mean / std,
                   state_affine=affine_from_stats(index.stats["state"], cfg.norm),
                   action_affine=affine_from_stats(index.stats["action"], cfg.norm))

    @classmethod
    def from_sources(cls, indexes: Sequence[ShardIndex], cfg: LoaderConfig, state_dim: int,
                     action_dim: int) -> "Normaliser":
        """A mixture's normaliser: each source's own statistics, as (sources, dim) tables an item picks
        its row of by `batch["source"]`; a source's channels beyond its own width map to 0 (scale and
        bias 0), so the zero padding survives normalisation."""
        norm = cls.from_index(indexes[0], cfg)
        tables = []
        for part, dim in (("state", state_dim), ("action", action_dim)):
            scale, bias = torch.zeros(len(indexes), dim), torch.zeros(len(indexes), dim)
            for s, index in enumerate(indexes):
                a, c = affine_from_stats(index.stats[part], cfg.norm)
                scale[s, : a.numel()], bias[s, : c.numel()] = a, c
            tables.append((scale, bias))
        norm.state_affine, norm.action_affine = tables
        return norm

    def to(self, device: torch.device | str) -> "Normaliser":
        mv = lambda t: t.to(device)  # noqa: E731
        return Normaliser(cfg=self.cfg, layout=self.layout, image_scale=mv(self.image_scale),
                          image_bias=mv(self.image_bias), state_affine=tuple(map(mv, self.state_affine)),
                          action_affine=tuple(map(mv, self.action_affine)))

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.cfg.image_dtype == "bfloat16" else torch.float32

    def __call__(self, batch: dict[str, torch.Tensor], *, epoch: int = 0, step: int = 0) -> dict[str, torch.Tensor]:
        out = dict(batch)
        if IMAGES in batch:
            out[IMAGES] = self.images(batch[IMAGES], batch.get("row"), epoch=epoch, step=step)
        else:  # one tensor per slot (cameras of different sizes), or per size group (a mixture's)
            views = slot_groups(batch)
            out = {k: v for k, v in out.items() if not (is_slot_key(k) or is_items_key(k))}
            out.update(self.slot_views(views, batch.get("row"), epoch=epoch, step=step))
        out["state"] = self.vector(batch["state"], self.state_affine, batch.get("source"))
        out["action"] = self.vector(batch["action"], self.action_affine, batch.get("source"))
        return out

    @staticmethod
    def vector(x: torch.Tensor, affine: tuple[torch.Tensor, torch.Tensor],
               source: torch.Tensor | None) -> torch.Tensor:
        """(B, T, D) state or action -> x * scale + bias; a mixture's (sources, D) tables per item's source."""
        scale, bias = affine
        if scale.dim() == 2:
            scale, bias = scale[source][:, None], bias[source][:, None]
        return x.float() * scale + bias

    def images(self, u8: torch.Tensor, rows: torch.Tensor | None = None, *, epoch: int = 0,
               step: int = 0) -> torch.Tensor:
        """(B, K, T, *frame_shape) uint8 -> (B, K, T, 3, H', W') in the configured dtype; tiled
        (`cfg.tile`): (B, 1, T, 3, H', W') canvases, built from the views before scaling."""
        lead = u8.shape[:3]
        flat = u8.reshape(-1, *u8.shape[3:])
        if self.fused_nv12 is not None:
            out = self.fused_nv12(flat, self.dtype)
            return out.view(*lead, *out.shape[1:])
        per_image = None if rows is None else rows.to(flat.device).repeat_interleave(lead[1] * lead[2])
        x = self._geometry(self._rgb(flat), epoch, step, per_image)
        return self._finish(x.reshape(*lead, *x.shape[1:]), rows, epoch)

    def slot_views(self, views: Sequence[torch.Tensor | SlotGroups], rows: torch.Tensor | None = None, *,
                   epoch: int = 0, step: int = 0) -> dict[str, torch.Tensor]:
        """Per kept slot (B, T, *frame_shape_j) uint8 of different sizes -> {"images": (B, K, T, 3, H', W')}
        when resize (or crop) brings every view to one size, as `images` would give; else each slot
        normalised at its own size, {"images.<j>": (B, T, 3, H_j, W_j)} (tiling needs one size).
        A slot may also come as size groups (`slots.slot_groups`, a mixture's sources of different
        sizes): each group is brought to the model's size on its own, then written to its items' rows."""
        groups = [v if isinstance(v, list) else [(v, None)] for v in views]
        first = groups[0][0][0]
        b, t = sum(v.shape[0] for v, _ in groups[0]), first.shape[1]
        if self.fused_nv12 is not None:  # no resize, crop or jitter: each view at its stored size
            if any(len(g) > 1 for g in groups):
                raise _size_error({tuple(v.shape[2:4]) for g in groups if len(g) > 1 for v, _ in g})
            xs = [self.fused_nv12(g[0][0].flatten(0, 1), self.dtype) for g in groups]
            return {slot_key(j): x.view(b, t, *x.shape[1:]) for j, x in enumerate(xs)}
        rows = None if rows is None else rows.to(first.device)
        xs = [self._group_geometry(g, b, t, rows, epoch, step) for g in groups]
        if len({tuple(x.shape[-2:]) for x in xs}) > 1:
            if self.cfg.tile is not None:
                sizes = sorted({f"{x.shape[-2]}x{x.shape[-1]}" for x in xs})
                raise ValueError(f"tile={self.cfg.tile!r} needs views of one size, got {', '.join(sizes)}; set "
                                 "resize=(H, W) to bring each view to the canvas cell")
            return {slot_key(j): self._finish(x.reshape(b, 1, t, *x.shape[1:]), rows, epoch)[:, 0]
                    for j, x in enumerate(xs)}
        if len({x.dtype for x in xs}) > 1:  # some views resized (float), some already at the size (uint8)
            xs = [x.float() for x in xs]
        return {IMAGES: self._finish(torch.stack([x.reshape(b, t, *x.shape[1:]) for x in xs], dim=1), rows, epoch)}

    def _group_geometry(self, groups: SlotGroups, b: int, t: int, rows: torch.Tensor | None, epoch: int,
                        step: int) -> torch.Tensor:
        """One slot's (B * T, 3, H, W) frames after `_geometry`: its one view, or each size group's
        brought to one size and put at its items' rows (an index_copy on the device: no host sync)."""
        out = None
        for v, items in groups:
            per_image = None if rows is None else (rows if items is None else rows[items]).repeat_interleave(t)
            x = self._geometry(self._rgb(v.flatten(0, 1)), epoch, step, per_image)
            if items is None:
                return x
            if out is None:
                out = torch.empty((b, t, *x.shape[1:]), dtype=torch.float32, device=x.device)
            elif out.shape[2:] != x.shape[1:]:
                raise _size_error({tuple(out.shape[-2:]), tuple(x.shape[-2:])})
            out.index_copy_(0, items, x.view(-1, t, *x.shape[1:]).float())
        return out.flatten(0, 1)

    def _rgb(self, flat: torch.Tensor) -> torch.Tensor:
        """(N, *frame_shape) uint8 as stored -> (N, 3, H, W): a uint8 view for rgb (converted inside
        the final fused op), float in [0, 255] for nv12."""
        return nv12_to_rgb_float(flat) if self.layout == "nv12" else flat.permute(0, 3, 1, 2)

    def _geometry(self, x: torch.Tensor, epoch: int, step: int, rows: torch.Tensor | None) -> torch.Tensor:
        """Resize to `cfg.resize` (the way `cfg.resize_mode` says), then crop, then (`cfg.crop_resize`)
        resize the crop back to `cfg.resize`. `rows`: each image's sample row (N,), for per-sample crops."""
        cfg = self.cfg
        if cfg.resize is not None:
            x = resize_view(x, cfg.resize, cfg.resize_mode)
        if cfg.crop is not None:
            x = self._crop(x, epoch, step) if not cfg.crop_per_sample else self._crop_per_sample(x, rows, epoch)
            if cfg.crop_resize:
                x = resize_view(x, cfg.resize, cfg.resize_mode)
        return x

    def _finish(self, x: torch.Tensor, rows: torch.Tensor | None, epoch: int) -> torch.Tensor:
        """(B, K, T, 3, H, W) views -> jitter, tiling, scale and mean/std in the output dtype."""
        cfg, lead = self.cfg, x.shape[:3]
        x = x.flatten(0, 2)
        if cfg.colour_jitter > 0 and rows is not None:
            x = self._jitter(x.float(), rows, lead, epoch)
        if cfg.tile is not None:  # uint8 (or float after resize/jitter) views -> one canvas per frame
            x = tile_views(x.reshape(*lead, *x.shape[1:]), cfg.tile)
            lead = x.shape[:3]
            x = x.flatten(0, 2)
        h, w = x.shape[-2:]
        out = torch.empty((x.shape[0], 3, h, w), dtype=self.dtype, device=x.device)
        torch.addcmul(self.image_bias.view(1, 3, 1, 1), x, self.image_scale.view(1, 3, 1, 1), out=out)
        return out.view(*lead, 3, h, w)

    def _crop(self, x: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
        ch, cw = self.cfg.crop
        h, w = x.shape[-2:]
        if ch > h or cw > w:
            raise ValueError(f"crop {ch}x{cw} is larger than the image {h}x{w}")
        if self.cfg.random_crop:  # one offset per batch keeps the crop a view (no gather)
            top, left = crop_offsets(self.cfg.seed, epoch, step, h - ch + 1, w - cw + 1)
        else:
            top, left = (h - ch) // 2, (w - cw) // 2
        return x[..., top : top + ch, left : left + cw]

    def _crop_per_sample(self, x: torch.Tensor, rows: torch.Tensor | None, epoch: int) -> torch.Tensor:
        """(N, C, H, W) -> (N, C, ch, cw): each image's window at (top, left) hashed from its sample's
        row (uniform over the places the window fits), gathered on the device: no host sync."""
        if rows is None:
            raise ValueError("crop_per_sample needs the batch's frame-table rows (batch['row'])")
        ch, cw = self.cfg.crop
        n, _, h, w = x.shape
        if ch > h or cw > w:
            raise ValueError(f"crop {ch}x{cw} is larger than the image {h}x{w}")
        key = aug_key(self.cfg.seed, epoch, CROP)
        top = (hash_uniform(2 * rows, key) * (h - ch + 1)).long()
        left = (hash_uniform(2 * rows + 1, key) * (w - cw + 1)).long()
        r = top[:, None, None] + torch.arange(ch, device=x.device)[None, :, None]
        c = left[:, None, None] + torch.arange(cw, device=x.device)[None, None, :]
        image = torch.arange(n, device=x.device)[:, None, None]
        return x.permute(0, 2, 3, 1)[image, r, c].permute(0, 3, 1, 2)

    def _jitter(self, x: torch.Tensor, rows: torch.Tensor, lead: torch.Size, epoch: int) -> torch.Tensor:
        """Per-sample brightness and contrast in [1 - j, 1 + j], the same for a sample's frames."""
        j, key = self.cfg.colour_jitter, aug_key(self.cfg.seed, epoch, JITTER)
        rows = rows.to(x.device)
        bright = 1.0 + j * (2.0 * hash_uniform(rows, key) - 1.0)
        contrast = 1.0 + j * (2.0 * hash_uniform(rows, key + 1) - 1.0)
        per = lead[1] * lead[2]  # frames per sample (slots x window)
        bright = bright.repeat_interleave(per).view(-1, 1, 1, 1)
        contrast = contrast.repeat_interleave(per).view(-1, 1, 1, 1)
        grey = x.mean(dim=(1, 2, 3), keepdim=True)
        return ((x - grey) * contrast + grey).mul_(bright).clamp_(0.0, 255.0)

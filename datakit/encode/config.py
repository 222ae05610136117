"""`EncodeConfig`: every option of `datakit encode`, checked once, and the two views of it a run
records: `options()` (how the features were made: part of the fingerprint) and the paths.

Everything that changes the stored bytes is in the fingerprint (docs/encode.md): the encoders'
digests, the size and resize, the clip length and stride, the seed and clips per episode, the
camera (or the tiled slots), the dtype, the first-frame conditioning and the batch size (batched
convolutions may round differently from single ones). Workers and the engine are not: any of them
gives the same bytes.

`tile` (with `slots`): the clip is the loader's tiled canvas of several cameras (`encode/canvas.py`),
the names and meaning of `LoaderConfig.slots` / `tile`; `size` is then the canvas's, each view
stretched to its cell (half of it) the loader's way ("stretch").
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datakit.errors import ConfigError
from datakit.loader.tiling import TILE_MODES, TILE_SLOTS

DTYPE_NAMES = ("float32", "float16", "bfloat16")
COND_MODES = ("none", "first-frame")  # first-frame: Wan2.1 I2V, VAE of [frame 0, zeros], frames 1.. kept
RESIZE = "bilinear"  # the one camera's resize: torch bilinear, align_corners=False, no antialias (Wan's pipelines)
TILED_RESIZE = "stretch"  # a tiled canvas's views: the loader's resize (`loader/resize.py`: bilinear, antialias)


# the largest --size side: 8x Wan's 720p height and 6x its 1280 width; beyond it one 33-frame clip's
# float32 VAE input alone passes 26 GiB (at 8192x8192), before any encoder runs
MAX_SIDE = 8192


def _gib(n: int) -> str:
    return f"{n / 2**30:,.0f} GiB"


@dataclass(kw_only=True)
class EncodeConfig:
    vae: Path  # a diffusers AutoencoderKLWan folder (config.json + *.safetensors)
    text_encoder: Path | None = None  # a transformers UMT5EncoderModel folder (+ tokenizer files, or ../tokenizer)
    image_encoder: Path | None = None  # a transformers CLIPVisionModel folder (+ preprocessor, or ../image_processor)
    frames: int = 33  # frames per clip: 1 + 4k (the causal VAE: frame 0 alone, then groups of 4)
    stride: int = 1  # source frames between two clip frames
    size: tuple[int, int] | None = None  # (H, W) the frames are resized to; None: the stored size
    dtype: str = "bfloat16"  # the encoders' dtype, and so the stored one
    seed: int = 0  # the clip list is a pure function of (seed, source index)
    clips_per_episode: int = 0  # clips drawn per episode; 0: as many as fit without overlap
    camera: str | None = None  # the source camera encoded; None: the first one of the index
    slots: tuple[str, ...] = ()  # with `tile`: the cameras of the canvas, in canvas order; (): the index's
    tile: str | None = None  # tile the slots into one canvas per frame (loader/tiling.py TILE_MODES)
    cond: str = "none"  # first-frame conditioning latents (COND_MODES)
    text_len: int = 512  # tokenizer max length (umT5: 512); only the real tokens are stored
    batch: int = 1  # clips per VAE call (GPU: 4-8); part of the fingerprint
    workers: int = 1  # local processes (one GPU each where there are GPUs)
    engine: str = "local"  # "local" | "ray" (one task per shard)
    ray_address: str | None = None  # join this Ray cluster (else a local instance)
    device: str | None = None  # "cpu" | "cuda"; None: cuda when available
    progress: bool = True

    def __post_init__(self) -> None:
        self.vae = Path(self.vae)
        self.text_encoder = Path(self.text_encoder) if self.text_encoder is not None else None
        self.image_encoder = Path(self.image_encoder) if self.image_encoder is not None else None
        if self.frames < 1 or (self.frames - 1) % 4:
            raise ConfigError("--clip", f"{self.frames} frames: the Wan VAE takes 1 + 4k frames (1, 5, ..., 33)")
        if self.stride < 1:
            raise ConfigError("--clip", f"stride {self.stride} must be >= 1")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise ConfigError("--size", f"{self.size} is not HxW")
        if self.size is not None and max(self.size) > MAX_SIDE:
            raise ConfigError("--size", f"{self.size[0]}x{self.size[1]}: a side beyond {MAX_SIDE} pixels (one clip "
                                        f"would be {_gib(3 * 4 * self.frames * self.size[0] * self.size[1])} of "
                                        "float32 before the VAE)")
        self.slots = tuple(self.slots)
        if self.tile is not None:
            if self.tile not in TILE_MODES:
                raise ConfigError("--tile", f"{self.tile!r} is not one of {', '.join(TILE_MODES)}")
            n = TILE_SLOTS[self.tile]
            if len(self.slots) not in (0, n) or len(set(self.slots)) != len(self.slots) or not all(self.slots):
                raise ConfigError("--slots", f"{','.join(self.slots)}: --tile {self.tile} takes {n} distinct "
                                             "cameras in canvas order (wrist, exterior, exterior)")
            if self.camera is not None:
                raise ConfigError("--camera", "a tiled canvas takes its cameras from --slots, not --camera")
            if self.size is not None and (self.size[0] % 2 or self.size[1] % 2):
                raise ConfigError("--size", f"{self.size[0]}x{self.size[1]}: the canvas of --tile {self.tile} is "
                                            "2 x 2 cells, so both sides must be even")
        elif self.slots:
            raise ConfigError("--slots", "names the cameras of a tiled canvas: give --tile too (one camera: --camera)")
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError("--dtype", f"{self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        if self.cond not in COND_MODES:
            raise ConfigError("--cond", f"{self.cond!r} is not one of {', '.join(COND_MODES)}")
        for name in ("clips_per_episode", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')}", "must be >= 0")
        for name in ("batch", "workers", "text_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}", "must be >= 1")
        if self.engine not in ("local", "ray"):
            raise ConfigError("--engine", f"{self.engine!r} is not local or ray")

    @property
    def span(self) -> int:
        """Source frames one clip covers."""
        return (self.frames - 1) * self.stride + 1

    @property
    def cell(self) -> tuple[int, int] | None:
        """Tiled: (H, W) each view is stretched to, half the canvas `size` (None: the stored size)."""
        return (self.size[0] // 2, self.size[1] // 2) if self.tile is not None and self.size is not None else None

    def options(self) -> dict[str, Any]:
        """How the features are made (paths excluded: the encoders enter by digest). `slots` and
        `tile` only when tiled, so an untiled folder's fingerprint is what it was before tiling."""
        opts = {"frames": self.frames, "stride": self.stride, "size": list(self.size) if self.size else None,
                "resize": RESIZE if self.tile is None else TILED_RESIZE, "dtype": self.dtype, "seed": self.seed,
                "clips_per_episode": self.clips_per_episode, "camera": self.camera, "cond": self.cond,
                "text_len": self.text_len, "batch": self.batch}
        if self.tile is not None:
            opts.update(slots=list(self.slots), tile=self.tile)
        return opts

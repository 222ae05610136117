"""The one configuration of the shard loader: what a sample is, how samples are ordered, how
the model's image slots are filled and how a batch is normalised on the device.

Every knob is a field with a comment; `__post_init__` rejects combinations that cannot work,
so a bad config fails at construction with the reason instead of mid-epoch. Checks that need
the index (cameras exist, the window fits an episode) happen in `ShardDataset`.

A model's sample shape (frame offsets, action horizon, slots, tiling) is its trainer's business:
trainkit's loader presets live with each model family (trainkit/models/<family>/batches.py).
A LoaderConfig travels between programs as TOML (`datakit plan OUT --loader-config FILE`, what
`trainkit inspect CONFIG --loader-toml FILE` writes):

    text = loader_config_to_toml(cfg)                        # a [loader] table of every set field
    cfg = loader_config_from_toml("loader.toml", batch_size=64)   # keyword arguments override the file
"""
from __future__ import annotations

import tomllib
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from datakit.errors import ConfigError
from datakit.loader.resize import RESIZE_MODES
from datakit.loader.tiling import TILE_MODES, TILE_SLOTS
from datakit.shards.open_files import DEFAULT_MAX_OPEN, VERIFY_MODES
from datakit.toml_values import toml_value

SHUFFLE_MODES = ("random", "shard_block", "sequential")
BOUNDARY_MODES = ("pad", "skip")
ON_ERROR_MODES = ("raise", "skip")
NORM_MODES = ("mean_std", "quantile", "none")
DTYPES = ("bfloat16", "float32")


@dataclass(kw_only=True)
class LoaderConfig:
    # --- what one sample is -------------------------------------------------------------
    # Frame offsets read for each camera, relative to the anchor t (e.g. (0,) for Pi0.5,
    # tuple(range(-32, 1)) for a 33-frame DreamZero clip, (-8, -4, 0) for a strided clip).
    frame_offsets: tuple[int, ...] = (0,)
    # Per-camera override of `frame_offsets` (camera name -> offsets).
    camera_offsets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Offsets of `observation.state` relative to t (most policies use the current state).
    state_offsets: tuple[int, ...] = (0,)
    # Number of future actions per sample: rows t .. t + action_horizon - 1.
    action_horizon: int = 1
    # The frame rate the offsets above count in: 0 = the data's own. Set, each folder reads the row
    # nearest each offset at its own rate (a 30 fps folder read at fps=10 takes every third row); a
    # mixture of sources at different rates needs it (datakit/loader/mixture.py).
    fps: float = 0.0
    # At episode ends: "pad" keeps every anchor and repeats the edge frame / action with an
    # `*_is_pad` mask (LeRobot's behaviour); "skip" keeps only anchors whose whole window
    # and action horizon fit inside the episode.
    boundary: str = "pad"
    # Sample only anchors of these episodes (their `episode_index`); None: every episode. A trainer
    # holds whole episodes out for validation with it: windows are clamped to the anchor's episode,
    # so a sample of one set never reads a frame, state or action of the other.
    episodes: tuple[int, ...] | None = None

    # --- camera slots -------------------------------------------------------------------
    # The model's fixed image slots, in order: each names a dataset camera or None (a slot
    # the dataset never fills). Empty tuple: one slot per dataset camera, in index order.
    slots: tuple[str | None, ...] = ()
    # Drop, per batch, slots that no sample fills (blank or missing camera) and return the
    # kept slot names plus an image mask, so the model spends no tokens on padding.
    prune_slots: bool = True

    # --- order ----------------------------------------------------------------------------
    seed: int = 0  # the one global seed, the same on every rank
    batch_size: int = 32  # samples per rank per step
    # "random": full permutation (local disks); "shard_block": permuted blocks of
    # consecutive rows, read sequentially (slow / remote storage); "sequential": no shuffle.
    shuffle: str = "random"
    block_size: int = 1024  # anchors per block in "shard_block" mode
    drop_last: bool = True  # drop the epoch's tail that does not fill a global batch
    # The epoch is a whole number of these samples (0: the global batch, world_size x batch_size);
    # a multiple of the global batch. Trainers set the optimiser's global batch (with gradient
    # accumulation), so the order does not depend on how it is split into ranks (sampler.py).
    epoch_batch: int = 0
    rank: int = 0
    world_size: int = 1

    # --- reading and bad input --------------------------------------------------------------
    num_workers: int = 0  # DataLoader worker processes
    prefetch_factor: int = 2  # batches each worker keeps ready
    # Shared-memory batch buffers per worker, allocated once and reused (see `shm_pool`);
    # 0 = prefetch_factor + 2: the most a worker can have in flight, plus the two batches a
    # training loop holds (the one in hand, the one before it), so it never waits.
    # /dev/shm must hold num_workers x buffers x one batch's image bytes (checked at start).
    worker_buffers: int = 0
    # Host batches lend their images instead of copying them (`loader/loans.py`): the buffer a
    # worker read into (without workers, one of worker_buffers reused buffers), refilled only once
    # no tensor refers to it (the batch, a slice, a `.numpy()` of it), so a batch stays intact
    # for as long as any part of it is held. A worker's last free buffer is never lent, so
    # keeping every batch falls back to copies. False: every batch is copied into new memory
    # (2.3x fewer items/s at 480x640 with 2 workers on 2 cores; bench/results/loader.md).
    lend_batches: bool = True
    # "raise": a damaged or missing shard stops with an error naming it; "skip": the
    # sample is dropped from its batch and counted in `batch["num_skipped"]`. A remote shard
    # that cannot be downloaded after the retries raises StorageError in both modes.
    on_error: str = "raise"
    # How a shard is checked when a process opens it (`shards/open_files.py`): "size" (stat,
    # free; blind to bytes changed in place) or "sha256" (hashes each shard once per process
    # before its first read; catches flipped bytes).
    verify: str = "size"
    # Shards a process keeps open at once (least recently used closed first), so thousands of
    # shards never exhaust the open-file limit (1024 by default) in any worker.
    max_open_shards: int = DEFAULT_MAX_OPEN
    # Reads of frames closer than this many bytes are merged into one pread with the gap
    # discarded, so a clip of consecutive frames is one contiguous read.
    coalesce_gap: int = 1 << 20

    # --- remote shard roots (s3://, gs://, ...; see `storage/cache.py`) ------------------------
    # Node-local folder where whole shards are downloaded and kept (LRU), shared by the ranks
    # of a node; None: $DATAKIT_CACHE, else ~/.cache/datakit/shards. Unused for a local root.
    cache_dir: str | None = None
    # Size limit of that cache in bytes; 0: half of the folder's free disk space at start. It
    # must hold the largest shard; use shuffle="shard_block" when it is smaller than the data.
    cache_bytes: int = 0
    # fsspec options of the root's filesystem (e.g. {"endpoint_url": ..., "anon": True});
    # None: the filesystem's own defaults (AWS_* variables and the like).
    storage_options: dict[str, Any] | None = None

    # --- device batch ------------------------------------------------------------------------
    pin_memory: bool = True  # copy to the device from page-locked host memory (CUDA only; see gpu_batch)
    # With workers and pin_memory: page-lock the workers' shared-memory ring for CUDA
    # (cudaHostRegister), so the copy to the device reads the buffers the workers filled. It locks
    # the whole ring (num_workers x buffers x a batch with every slot) for the stream's life.
    # False: stage each batch into a small pinned ring (one host copy per step, feeder thread).
    register_ring: bool = True
    image_dtype: str = "bfloat16"  # dtype of normalised images on the device
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # after scaling to [0, 1]
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # (H, W) every view is resized to on the device (each camera from its own stored size, before
    # tiling); a view already at (H, W) is left alone. None: views keep their stored sizes.
    resize: tuple[int, int] | None = None
    # How (`loader/resize.py`): "stretch" (bilinear, antialiased, to (H, W) exactly) or "pad" (Pi0.5's
    # aspect-preserving resize-with-pad of LeRobot / openpi: scaled to fit, centred, black borders).
    resize_mode: str = "stretch"
    # Tile the slots' views into one canvas per frame on the device (`loader/tiling.py`):
    # "wrist_top" = 3 slots (wrist, exterior, exterior) -> (2H, 2W), the wrist widened across the
    # top row; images then have one slot, (B, 1, T, 3, 2H, 2W). None: one image per slot. With
    # `slots` empty the index's cameras are the views, in index order (checked against the index).
    tile: str | None = None
    crop: tuple[int, int] | None = None  # (H, W) crop after resize
    random_crop: bool = False  # random (seeded per step) instead of centre crop
    # With random_crop: one window per sample (a pure function of its frame-table row, epoch and seed;
    # shared by its views and frames), as Isaac-GR00T's and LeRobot's N1.7 training crop; False: one
    # window per batch (the crop stays a view, no gather)
    crop_per_sample: bool = False
    # After the crop, resize the view back to `resize` the same way (GR00T N1.7: bicubic to 256 x 256,
    # centre crop 230 x 230, bicubic back to 256 x 256); needs resize and crop
    crop_resize: bool = False
    colour_jitter: float = 0.0  # max relative brightness/contrast change, 0 = off
    # State / action normalisation with the index statistics: (x - mean) / std, or
    # "quantile": mapped so q01 -> -1 and q99 -> +1 (Pi0.5 style), or "none".
    norm: str = "mean_std"

    def __post_init__(self) -> None:
        _choice("shuffle", self.shuffle, SHUFFLE_MODES)
        _choice("boundary", self.boundary, BOUNDARY_MODES)
        _choice("on_error", self.on_error, ON_ERROR_MODES)
        _choice("norm", self.norm, NORM_MODES)
        _choice("verify", self.verify, VERIFY_MODES)
        _choice("image_dtype", self.image_dtype, DTYPES)
        _choice("resize_mode", self.resize_mode, RESIZE_MODES)
        self.frame_offsets = _offsets("frame_offsets", self.frame_offsets)
        self.state_offsets = _offsets("state_offsets", self.state_offsets)
        self.camera_offsets = {c: _offsets(f"camera_offsets[{c!r}]", o) for c, o in self.camera_offsets.items()}
        self.slots = tuple(self.slots)
        if self.episodes is not None:
            self.episodes = tuple(sorted({int(e) for e in self.episodes}))
            if not self.episodes:
                raise ValueError("episodes is empty; use None for every episode")
        named = [s for s in self.slots if s is not None]
        if len(set(named)) != len(named):
            raise ValueError(f"slots name a camera twice: {self.slots}")
        if not self.fps >= 0:
            raise ValueError(f"fps must be >= 0 (0: the data's own), got {self.fps}")
        if self.action_horizon < 1:
            raise ValueError(f"action_horizon must be >= 1, got {self.action_horizon}")
        if self.batch_size < 1 or self.block_size < 1:
            raise ValueError("batch_size and block_size must be >= 1")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank} world_size={self.world_size}")
        if self.epoch_batch < 0 or self.epoch_batch % (self.batch_size * self.world_size):
            raise ValueError(f"epoch_batch={self.epoch_batch} is not a multiple of world_size x batch_size "
                             f"= {self.world_size} x {self.batch_size}")
        if self.num_workers < 0 or self.prefetch_factor < 1 or self.worker_buffers < 0:
            raise ValueError("num_workers and worker_buffers must be >= 0 and prefetch_factor >= 1")
        if self.max_open_shards < 1:
            raise ValueError(f"max_open_shards must be >= 1, got {self.max_open_shards}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0 (0: half the free disk space), got {self.cache_bytes}")
        if isinstance(self.cache_dir, Path):
            self.cache_dir = str(self.cache_dir)
        if self.cache_dir is not None and (not isinstance(self.cache_dir, str) or "://" in self.cache_dir
                                           or not self.cache_dir):
            raise ValueError(f"cache_dir must be a local folder path as str, got {self.cache_dir!r}")
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise ValueError(f"storage_options must be a dict of fsspec options, got {type(self.storage_options).__name__}")
        for name in ("resize", "crop"):
            v = getattr(self, name)
            if v is not None and (len(v) != 2 or min(v) < 1):
                raise ValueError(f"{name} must be (height, width) with positive sizes, got {v}")
        if self.crop_per_sample and not self.random_crop:
            raise ValueError("crop_per_sample places a random crop per sample: it needs random_crop")
        if self.crop_resize and (self.resize is None or self.crop is None):
            raise ValueError("crop_resize resizes the crop back to `resize`: it needs both resize and crop")
        if self.tile is not None:
            _choice("tile", self.tile, TILE_MODES)
            if len(self.slots) not in (0, TILE_SLOTS[self.tile]) or self.prune_slots or self.crop is not None:
                raise ValueError(f"tile={self.tile!r} needs slots naming its {TILE_SLOTS[self.tile]} views in "
                                 f"canvas order (got {self.slots}; none: the index's cameras, which must then be "
                                 f"{TILE_SLOTS[self.tile]}), prune_slots=False (got {self.prune_slots}) "
                                 f"and no crop (got {self.crop})")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ValueError("image_mean / image_std need 3 values, std > 0")
        if not 0.0 <= self.colour_jitter < 1.0:
            raise ValueError(f"colour_jitter must be in [0, 1), got {self.colour_jitter}")

    def offsets_for(self, camera: str) -> tuple[int, ...]:
        return self.camera_offsets.get(camera, self.frame_offsets)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def _offsets(name: str, offsets: tuple[int, ...]) -> tuple[int, ...]:
    out = tuple(int(o) for o in offsets)
    if not out:
        raise ValueError(f"{name} is empty; use (0,) for the anchor frame alone")
    if list(out) != sorted(set(out)):
        raise ValueError(f"{name} must be strictly increasing, got {out}")
    return out



# --- as a TOML file ------------------------------------------------------------------------------
# TOML has no null: a field left at None is not written (reading it back gives the default, None),
# and an empty camera slot (None in `slots`) is written "" (as trainkit's data.slots writes it).
TOML_TABLE = "loader"


def loader_config_to_toml(cfg: LoaderConfig, comment: str = "") -> str:
    """`cfg` as TOML: one `[loader]` table holding every field that is not None, `comment` (lines)
    above it; `loader_config_from_toml` reads it back equal to `cfg`."""
    lines = [f"# {line}".rstrip() for line in comment.splitlines()]
    lines.append(f"[{TOML_TABLE}]")
    for f in fields(LoaderConfig):
        value = getattr(cfg, f.name)
        if value is None:
            continue
        if f.name == "slots":
            value = ["" if s is None else s for s in value]
        lines.append(f"{f.name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def loader_config_from_toml(path: str | Path, *, defaults: dict[str, Any] | None = None,
                            **overrides: Any) -> LoaderConfig:
    """The LoaderConfig of a TOML file (its `[loader]` table, or top-level keys), `overrides`
    (field=value, None ignored) on top, `defaults` for fields the file does not set. An unknown
    key, a value of the wrong type or a bad combination raises ConfigError naming the file and the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(path, "loader config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, f"cannot read the loader config ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, f"not valid TOML ({e})") from None
    data = data.get(TOML_TABLE, data)
    hints = typing.get_type_hints(LoaderConfig)
    kw: dict[str, Any] = dict(defaults or {})
    for key, value in data.items():
        if key not in hints:
            raise ConfigError(path, f"{key}: not a LoaderConfig field (known: {', '.join(hints)})")
        try:
            kw[key] = _from_toml(value, hints[key], slot=key == "slots")
        except (TypeError, ValueError) as e:
            raise ConfigError(path, f"{key}: {e}") from None
    kw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return LoaderConfig(**kw)
    except ValueError as e:  # __post_init__'s message names the field(s)
        raise ConfigError(path, str(e)) from None


def _from_toml(value: Any, hint: Any, slot: bool = False) -> Any:
    """A TOML value as the field type `hint` says (arrays -> tuples, ints -> floats where a float
    is wanted, "" -> None in `slots`); TypeError naming what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: TOML never holds the None
        (hint,) = [a for a in args if a is not type(None)]
        if slot and value == "":
            return None
        return _from_toml(value, hint, slot)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_toml(x, args[0], slot) for x in value)
        if len(value) != len(args):
            raise TypeError(f"expected an array of {len(args)} values, got {value!r}")
        return tuple(_from_toml(x, a) for x, a in zip(value, args))
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {value!r}")
        return {str(k): _from_toml(x, args[1]) for k, x in value.items()}
    raise TypeError(f"no TOML form for {hint}")

"""ConvertConfig: the one config object of `datakit convert`, from TOML and overridable on the CLI."""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from datakit.errors import ConfigError
from datakit.machine import available_cpus
from datakit.shards.manifest_check import LAYOUTS  # the colour layouts the shard contract knows
from datakit.stages.resize import parse_size


ON_ERROR = ("fail", "skip")
NONFINITE = ("reject", "keep")
FORMATS = ("auto", "lerobot", "droid")
ENGINES = ("local", "ray")
RENAMED = {"prefetch": "camera_threads"}  # old TOML key -> its name now, for the error that refuses it


@dataclass(kw_only=True)
class ConvertConfig:
    format: str = "auto"  # source format: auto | lerobot | droid
    decoder: str = "auto"  # pyav | decord | torchcodec | auto (fastest that reads the codec)
    decoder_threads: int = 1  # threads per decoder; episodes are parallel across --workers
    resize: str | None = None  # "HxW" applied to every camera (antialiased), None = native size
    layout: str = "rgb"  # rgb (H,W,3) or nv12 (1.5 bytes/pixel, read back as RGB)
    # processes converting in parallel; None: from the plan and the cores (convert/plan.py
    # plan_workers); more than the usable cores is clamped to them, with a warning
    workers: int | None = None
    shard_size: int = 1 << 30  # bytes; a shard is closed at the first episode boundary past it
    on_error: str = "fail"  # fail: stop at the first bad episode; skip: record it and go on
    # NaN/inf (or float64 beyond float32) in state/action: reject the episode as bad input, or
    # keep the values, leave them out of the statistics and count them there ("nonfinite")
    nonfinite: str = "reject"
    camera_threads: bool | None = None  # decode each camera on its own thread; None: only when workers < cores
    progress: bool = True  # progress bar on stderr
    engine: str = "local"  # local: a process pool on this machine; ray: one Ray task per shard (pip install .[ray])
    ray_address: str | None = None  # Ray cluster to join (e.g. "auto", "10.0.0.1:6379"); None: start a local Ray
    ray_cpus_per_task: float = 1.0  # CPUs Ray reserves for each task (a shard, or an episode below the shard)
    ray_memory_per_task: int | None = None  # bytes of memory Ray reserves for each task; None: no reservation

    def __post_init__(self) -> None:
        for name, allowed in (("format", FORMATS), ("layout", LAYOUTS), ("on_error", ON_ERROR),
                              ("nonfinite", NONFINITE), ("engine", ENGINES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(name, f"must be one of {allowed}, got {getattr(self, name)!r}")
        if self.resize is not None:
            try:
                h, w = parse_size(self.resize)
            except ValueError as e:
                raise ConfigError("resize", str(e)) from None
            if self.layout == "nv12" and (h % 2 or w % 2):
                raise ConfigError("resize", f"nv12 needs an even size, got --resize {self.resize}")
        memory = self.ray_memory_per_task
        for name, value, least in (("workers", 1 if self.workers is None else self.workers, 1), ("shard_size", self.shard_size, 1),
                                   ("decoder_threads", self.decoder_threads, 0),
                                   ("ray_memory_per_task", 1 if memory is None else memory, 1)):
            if value < least:
                raise ConfigError(name, f"must be >= {least}, got {value}")
        if self.ray_cpus_per_task <= 0:
            raise ConfigError("ray_cpus_per_task", f"must be > 0, got {self.ray_cpus_per_task}")

    @property
    def use_camera_threads(self) -> bool:
        """Per-camera decode threads pay off only where cores are left over by the workers."""
        return self.camera_threads if self.camera_threads is not None else (self.workers or available_cpus()) < available_cpus()

    @property
    def size(self) -> tuple[int, int] | None:
        return parse_size(self.resize) if self.resize else None

    def output_options(self) -> dict[str, Any]:
        """The options that determine the shard bytes (a rerun must match them to resume).
        on_error and nonfinite are not: like --on-error skip, --nonfinite keep only admits
        episodes that the stricter run refused, so a run stopped by one may be resumed with it.
        Nor is the decoder: every backend gives the same frames, byte for byte
        (tests/datakit/convert/test_convert_decoder_identity.py), so it is no part of a conversion's identity."""
        d = asdict(self)
        for k in ("decoder", "workers", "progress", "decoder_threads", "on_error", "nonfinite", "camera_threads", "engine",
                  "ray_address", "ray_cpus_per_task", "ray_memory_per_task"):
            d.pop(k)
        return d

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> "ConvertConfig":
        data = tomllib.loads(Path(path).read_text())
        data = data.get("convert", data)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            renamed = "".join(f"; {k} is now {RENAMED[k]}" for k in sorted(unknown) if k in RENAMED)
            raise ConfigError(path, f"unknown keys {sorted(unknown)} (known: {sorted(known)}){renamed}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)

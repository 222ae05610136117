"""ConvertConfig: the one config object of `datakit convert`, from TOML and overridable on the CLI."""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from datakit.machine import available_cpus
from datakit.stages.resize import parse_size

LAYOUTS = ("rgb", "nv12")
ON_ERROR = ("fail", "skip")
NONFINITE = ("reject", "keep")
FORMATS = ("auto", "lerobot", "droid")
ENGINES = ("local", "ray")


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
    prefetch: bool | None = None  # decode each camera on its own thread; None: only when workers < cores
    progress: bool = True  # progress bar on stderr
    engine: str = "local"  # local: a process pool on this machine; ray: one Ray task per shard (pip install .[ray])
    ray_address: str | None = None  # Ray cluster to join (e.g. "auto", "10.0.0.1:6379"); None: start a local Ray
    ray_cpus_per_task: float = 1.0  # CPUs Ray reserves for each task (a shard, or an episode below the shard)
    ray_memory_per_task: int | None = None  # bytes of memory Ray reserves for each task; None: no reservation

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite must be one of {NONFINITE}, got {self.nonfinite!r}")
        if self.resize is not None:
            h, w = parse_size(self.resize)
            if self.layout == "nv12" and (h % 2 or w % 2):
                raise ValueError(f"nv12 needs an even size, got --resize {self.resize}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.ray_cpus_per_task <= 0 or (self.ray_memory_per_task is not None and self.ray_memory_per_task < 1):
            raise ValueError("ray_cpus_per_task > 0 and ray_memory_per_task >= 1 (bytes) are required")
        if (self.workers is not None and self.workers < 1) or self.decoder_threads < 0 or self.shard_size < 1:
            raise ValueError("workers >= 1, decoder_threads >= 0 and shard_size >= 1 are required")

    @property
    def use_prefetch(self) -> bool:
        """Per-camera decode threads pay off only where cores are left over by the workers."""
        return self.prefetch if self.prefetch is not None else (self.workers or available_cpus()) < available_cpus()

    @property
    def size(self) -> tuple[int, int] | None:
        return parse_size(self.resize) if self.resize else None

    def output_options(self) -> dict[str, Any]:
        """The options that determine the shard bytes (a rerun must match them to resume).
        on_error and nonfinite are not: like --on-error skip, --nonfinite keep only admits
        episodes that the stricter run refused, so a run stopped by one may be resumed with it."""
        d = asdict(self)
        for k in ("workers", "progress", "decoder_threads", "on_error", "nonfinite", "prefetch", "engine",
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
            raise ValueError(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)

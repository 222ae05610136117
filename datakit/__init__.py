"""datakit: robot-learning episodes (LeRobot v2.0/v2.1/v3.0, raw DROID) -> verified uint8 frame shards.

    datakit convert SRC OUT      # decode once, offline, into shards + index
    datakit verify OUT           # re-hash shards, check every offset
    datakit info OUT [--json]
    datakit.open_shards(OUT).read_frame(episode, frame, camera)  # (H, W, 3) uint8, random access
"""
from __future__ import annotations

__all__ = ["open_shards", "ShardReader"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: the reader imports torch (~1 s); `import datakit.<submodule>` should not pay for it.
    if name in __all__:
        from datakit import reader

        return getattr(reader, name)
    raise AttributeError(f"module 'datakit' has no attribute {name!r}")

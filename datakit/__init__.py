"""datakit: robot-learning episodes (LeRobot v2.0/v2.1/v3.0, raw DROID) -> verified uint8 frame shards.

    datakit convert SRC OUT      # decode once, offline, into shards + index
    datakit verify OUT           # re-hash shards, check every offset
    datakit info OUT [--json]
    datakit.open_shards(OUT).read_frame(episode, frame, camera)  # (H, W, 3) uint8, random access
"""
from datakit.reader import ShardReader, open_shards

__all__ = ["open_shards", "ShardReader"]
__version__ = "0.1.0"

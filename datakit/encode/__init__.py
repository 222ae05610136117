"""`datakit encode SHARDS OUT`: frozen encoders run once, offline, into a verified feature folder.

    from datakit.encode import EncodeConfig, encode
    encode("shards/", "features/", EncodeConfig(vae="Wan2.2-TI2V-5B-Diffusers/vae", frames=33, size=(352, 640)))

config.py (options), clips.py (the clip list), canvas.py (the loader's tiled canvas of --slots /
--tile), models.py (diffusers / transformers encoders), shard.py (one feature shard, committed),
journal.py (resume), engines.py (local workers, Ray), run.py (the driver). The format: datakit/shards/features.py; docs/encode.md.
"""
from datakit.encode.config import EncodeConfig
from datakit.encode.run import EncodeSummary, encode

__all__ = ["EncodeConfig", "EncodeSummary", "encode"]

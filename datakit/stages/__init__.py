"""Frame stages applied between decoding and the shard writer: resize, colour layout, slot detection."""

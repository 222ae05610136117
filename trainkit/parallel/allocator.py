"""The CUDA caching allocator's expandable segments: fewer fragmented blocks at large batch.

`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lets the allocator grow one mapping instead of
carving fixed segments, so FSDP's all-gather buffers of varying size and the activations of
steps with different slot counts do not fragment memory into OOM. It must be set before the
first CUDA allocation, so the trainer calls this before it touches the GPU.
"""
from __future__ import annotations

import os


def set_expandable_segments(enabled: bool) -> None:
    """Add (or leave out) expandable_segments:True in PYTORCH_CUDA_ALLOC_CONF for this process."""
    conf = [c for c in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if c and
            not c.startswith("expandable_segments")]
    if enabled:
        conf.append("expandable_segments:True")
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf)
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)

"""Parameter names as the model defines them: parallelize() wraps blocks for recompute, compile and
(FSDP1-style) sharding, and each wrapper adds a component to `named_parameters()`; EMA state and
checkpoint mappings key on the name without them, so they are the same for any `parallel.*`."""
from __future__ import annotations

_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """`name` without the recompute / compile / FSDP wrapper components."""
    for w in _WRAPPERS:
        name = name.replace(w, "")
    return name

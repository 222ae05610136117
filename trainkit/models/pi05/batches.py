"""What `pi05` needs from datakit.loader: its loader preset (`pi05_config`, and `loader_config` at
a model config's shapes), and the batch adapter that adds the host-side extras and builds
`Pi05Batch` on the device.

Host side, per batch: the prompt tokens (task string + the normalised state discretised into bins,
pi05/tokenizer.py: PaliGemma's SentencePiece with `model.tokenizer`, else the built-in one) and the flow-matching noise and time, drawn from the batch's own CPU generator
(the trainer seeds it by (seed, loader epoch, loader step, rank), so they are the same on any
device, with any number of workers, and after a resume). Device side: the newest frame of each
kept slot, and the action chunk zero-padded to the model's action channels.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from datakit.loader import LoaderConfig, Normaliser
from datakit.loader.slots import view_sizes
from datakit.shards.index import ShardIndex
from trainkit.errors import BatchDataError
from trainkit.errors import TokenizerError
from trainkit.models.family import HostBatch
from trainkit.models.pi05.config import Pi05Config
from trainkit.models.pi05.model import Pi05Batch, sample_flow
from trainkit.models.pi05.tokenizer import PaligemmaPromptTokenizer, PromptTokenizer, sentencepiece_file


def pi05_config(**kw: Any) -> LoaderConfig:
    """Pi0.5-shaped samples: the current frame of 3 slots, 50 future actions, quantile norm."""
    return LoaderConfig(**{"frame_offsets": (0,), "action_horizon": 50, "norm": "quantile", **kw})


def loader_config(cfg: Pi05Config, index: ShardIndex | None, **kw: Any) -> LoaderConfig:
    """`pi05_config` at this model's shapes: `cfg.horizon` actions, and each camera view that is not
    `cfg.image_size` square resized to it on the device, the way `cfg.image_resize` says ("pad":
    LeRobot's / openpi's aspect-preserving resize-with-pad, datakit/loader/resize.py). Cameras may
    differ in size: each view is resized from its own. `kw`: the trainer's loader settings (slots,
    order, workers, norm, ...). Without the shard index (`trainkit inspect` with no shards) the frames'
    size is unknown: the resize is then kept (the run drops it when every view is stored at that size)."""
    size = (cfg.image_size, cfg.image_size)
    stored = set(view_sizes(index, kw.get("slots") or ()).values()) if index is not None else {None}
    return pi05_config(action_horizon=cfg.horizon, resize=None if stored <= {size} else size,
                       resize_mode=cfg.image_resize, **kw)


class Pi05Batches:
    """The `pi05` batch adapter (trainkit.models.family.BatchAdapter)."""

    def __init__(self, cfg: Pi05Config, index: ShardIndex, normaliser: Normaliser):
        self.cfg = cfg
        self.tasks = list(index.tasks)
        # host copy: the state for the prompt (a mixture's: (sources, D) tables, each item its source's row)
        self.state_affine = normaliser.state_affine
        self.tokenizer = PaligemmaPromptTokenizer(cfg.tokenizer, cfg.vocab, cfg.text_len, cfg.state_bins) \
            if sentencepiece_file(cfg.tokenizer) else PromptTokenizer(cfg.vocab, cfg.text_len, cfg.state_bins)

    def extras(self, hb: HostBatch, generator: torch.Generator) -> HostBatch:
        """Prompt tokens and flow noise/time (small tensors, copied with the batch)."""
        state = Normaliser.vector(hb["state"][:, -1:], self.state_affine, hb.get("source"))[:, 0]
        tasks = [self.tasks[i] for i in hb["task_index"].tolist()]
        try:
            tokens, token_mask = self.tokenizer.encode(tasks, state)
        except TokenizerError:
            bad = ~torch.isfinite(state).all(dim=1)
            if not bad.any():
                raise
            rows = hb["row"]  # a NaN/inf state (shards converted with --nonfinite keep): name its rows
            raise BatchDataError(rows.tolist(), rows[bad].tolist(), "non-finite state") from None
        b, c = state.shape[0], self.cfg
        noise, time = sample_flow(torch.zeros((b, c.horizon, c.action_dim)), generator)
        return {**hb, "tokens": tokens, "token_mask": token_mask, "noise": noise, "time": time}

    def model_batch(self, b: HostBatch) -> Pi05Batch:
        c = self.cfg
        actions = b["action"]
        if actions.shape[-1] < c.action_dim:  # datasets have fewer action dims: zero-padded to 32
            actions = F.pad(actions, (0, c.action_dim - actions.shape[-1]))
        # a mixture: each item's own robot's channels (the loader's mask), padded as the actions are
        mask = F.pad(b["action_mask"], (0, c.action_dim - b["action_mask"].shape[-1])) if "action_mask" in b else None
        return Pi05Batch(images=b["images"][:, :, -1], image_mask=b["image_mask"], tokens=b["tokens"],
                         token_mask=b["token_mask"], actions=actions.float(), noise=b["noise"], time=b["time"],
                         action_dims=b["action"].shape[-1], action_mask=mask)

"""`datakit plan FEATURES --samples-per-s N`: what a feature folder (`datakit encode`) costs per sample.

A feature batch reads every stored tensor of its clips (latents, conditioning, image features) from
the shards; text embeddings are read once per process (one per distinct prompt) and padded per
batch on the host. So the bytes read per sample are the clip fields' bytes; the host-to-device bytes
add the padded text (at the mean prompt length: the batch pads to its longest) and state/action.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from datakit.shards.features import FeatureIndex, load_clips, load_features, torch_dtype
from datakit.shards.index import column


@dataclass
class FeaturePlan:
    samples_per_s: float
    ranks: int
    ranks_per_node: int
    num_clips: int
    dataset_bytes: int
    bytes_per_sample: int  # read from the shards: the clip's tensors
    bytes_per_sample_by_field: dict[str, int]
    text_bytes_per_sample: float  # host-to-device, real tokens at the mean prompt length of the clips
    numeric_bytes_per_sample: int  # state + action (float32)
    read_bytes_per_s_per_rank: float
    read_bytes_per_s_per_node: float
    h2d_bytes_per_s_per_rank: float

    def to_dict(self) -> dict:
        return asdict(self)


def plan_features(folder: Path, *, samples_per_s: float, ranks: int, ranks_per_node: int) -> FeaturePlan:
    index: FeatureIndex = load_features(folder)
    prompts = column(load_clips(folder, index), "prompt")
    tokens = np.array([index.prompts[p].tokens if p >= 0 else 0 for p in prompts.tolist()], np.float64)
    text = float(tokens.mean()) * index.text_width * torch_dtype(index.text_dtype).itemsize if tokens.size else 0.0
    by_field = {k: f.bytes for k, f in index.fields.items()}
    per = sum(by_field.values())
    numeric = 4 * (len(index.state_names) + index.span * len(index.action_names))
    per_rank = samples_per_s / ranks
    return FeaturePlan(samples_per_s=samples_per_s, ranks=ranks, ranks_per_node=min(ranks, ranks_per_node),
                       num_clips=index.num_clips, dataset_bytes=sum(s.bytes for s in index.shards),
                       bytes_per_sample=per, bytes_per_sample_by_field=by_field, text_bytes_per_sample=text,
                       numeric_bytes_per_sample=numeric, read_bytes_per_s_per_rank=per * per_rank,
                       read_bytes_per_s_per_node=per * per_rank * min(ranks, ranks_per_node),
                       h2d_bytes_per_s_per_rank=(per + text + numeric) * per_rank)

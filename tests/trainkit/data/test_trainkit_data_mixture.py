"""trainkit/data.py over a weighted mixture: `read_mixture_shards` opens and checks each source as one
folder, `TrainData` yields the family's batches with each item's source, and the tiny model's loss on
them is finite (the per-source statistics, padding and the mixture's task list reach the model)."""
import math

import pytest
import torch

from loader_fixtures import shards_b, shards_rgb  # noqa: F401 - session fixtures
from datakit.loader import MixtureSource
from trainkit.config import DataConfig
from trainkit.data import TrainData, read_mixture_shards
from trainkit.errors import DataError
from trainkit.models import build_model, family


def mixture(a, b, b_slots=("cam.hand", "cam.front")):
    return [MixtureSource(root=str(a), weight=0.6, name="a"),
            MixtureSource(root=str(b), weight=0.4, name="b", slots=b_slots, prompt="stack them")]


def test_traindata_reads_a_mixture_into_model_batches(shards_rgb, shards_b):  # noqa: F811
    torch.manual_seed(0)
    model = build_model("pi05", "tiny")
    dcfg = DataConfig(shards=str(shards_rgb), num_workers=0,
                      slots=["observation.images.top", "observation.images.wrist"])
    shards = read_mixture_shards(dcfg, mixture(shards_rgb, shards_b), model.cfg.max_slots)
    data = TrainData(dcfg, shards, family("pi05"), model.cfg, seed=3, rank=0, world_size=1, micro_batch=10,
                     device=torch.device("cpu"), image_dtype=torch.float32, global_batch=10)
    assert [s.name for s in data.sources] == ["a", "b"]
    seen = set()
    for _, step in zip(range(3), data.batches()):
        seen |= set(step.sources.tolist())
        with torch.no_grad():
            assert math.isfinite(float(model(step.model)))
    assert seen == {0, 1}
    shards.close()


def test_a_source_slot_naming_a_missing_camera_is_refused(shards_rgb, shards_b):  # noqa: F811
    dcfg = DataConfig(shards=str(shards_rgb), num_workers=0)
    with pytest.raises(DataError, match="the source's slots names camera 'cam.top'"):
        read_mixture_shards(dcfg, mixture(shards_rgb, shards_b, b_slots=("cam.top", None)), 3)

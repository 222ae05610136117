"""`LoaderConfig.episodes`: a stream over some episodes only (a trainer's validation holdout).

Oracle: the frame table read with pyarrow. The selection's anchors are exactly the full stream's
anchors of those episodes, and a batch of all of them carries those episodes only (windows are
clamped to the anchor's episode, as every stream's are: tests/datakit/loader/test_loader_dataset.py).
"""
import numpy as np
import pytest

from datakit.loader import LoaderConfig, ShardDataset
from datakit.shards.index import load_frames
from loader_fixtures import LENGTHS, shards_rgb  # noqa: F401 - session fixture


def test_a_selection_samples_and_reads_its_episodes_only(shards_rgb):  # noqa: F811
    episode = load_frames(shards_rgb).column("episode_index").to_numpy()
    every = ShardDataset(shards_rgb, LoaderConfig(action_horizon=8))
    some = ShardDataset(shards_rgb, LoaderConfig(action_horizon=8, episodes=(3, 1)))
    assert some.cfg.episodes == (1, 3)
    assert np.array_equal(some.anchors, every.anchors[np.isin(episode[every.anchors], [1, 3])])
    assert len(some) == LENGTHS[1] + LENGTHS[3]
    batch = some.read_batch(list(range(len(some))))
    assert set(batch["episode_index"].tolist()) == {1, 3}
    assert set(episode[batch["row"].numpy()].tolist()) == {1, 3}


def test_a_selection_names_what_the_index_lacks(shards_rgb):  # noqa: F811
    with pytest.raises(ValueError, match=r"episodes \[7\] are not in the index"):
        ShardDataset(shards_rgb, LoaderConfig(episodes=(1, 7)))
    with pytest.raises(ValueError, match="episodes is empty"):
        LoaderConfig(episodes=())

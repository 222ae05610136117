"""The loader tests' shard fixture (tests/fixtures/loader_fixtures.py) meets the contract the loader
relies on: shard count, frame count, the blank camera, frame-major offsets."""
import numpy as np

from loader_fixtures import CAMS, LENGTHS, shards_rgb  # noqa: F401


def test_fixture_meets_the_contract(shards_rgb):
    from datakit.reader import open_shards

    r = open_shards(shards_rgb)
    assert r.index.num_shards >= 2 and r.index.num_frames == sum(LENGTHS)
    assert [e.camera_status[CAMS[2]] for e in r.index.episodes] == ["blank"] * len(LENGTHS)
    # frames of one episode are frame-major and increasing in their shard
    off = r.offsets[CAMS[0]][: LENGTHS[0]]
    assert np.all(np.diff(off) > 0)

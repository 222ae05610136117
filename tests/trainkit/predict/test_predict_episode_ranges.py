"""`trainkit predict --episodes`: a range is checked against the shards' episodes without being
built, so `0-100000000000` is one line naming the episodes the shards lack, in constant memory
(before: a set of 10^11 ints, 24 GB, then the OOM killer)."""
from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import pytest

from trainkit.errors import DataError
from trainkit.predict.chunks import parse_episodes

INDEX = SimpleNamespace(episodes=[SimpleNamespace(episode_index=i) for i in (0, 1, 2, 3, 5)])


def _peak(call) -> int:
    tracemalloc.start()
    try:
        call()
    except DataError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_a_huge_range_is_refused_without_being_built():
    assert _peak(lambda: parse_episodes("0-3000000", INDEX, "W")) < 1 << 20  # a 3M range: under 1 MB
    with pytest.raises(DataError, match=r"^W: --episodes names episodes \[4, 6, 7, 8, 9, 10, 11, 12\] and "
                                        r"99999999988 more, which the shards lack \(they have 5: 0..5\)$"):
        parse_episodes("0-100000000000", INDEX, "W")


def test_ranges_the_shards_hold_are_chosen():
    assert parse_episodes("0-3,5", INDEX, "W") == (0, 1, 2, 3, 5)
    assert parse_episodes("2-3, 1-2,5-5", INDEX, "W") == (1, 2, 3, 5)
    with pytest.raises(DataError, match=r"names episodes \[4\], which the shards lack"):
        parse_episodes("3-5", INDEX, "W")

"""Downloads ahead of the reader: the background thread of a `ShardCache` (storage/cache.py)
that fetches shards in the order the sampler will read them, staying at most `ahead_bytes`
ahead of the reader, so the shards a batch needs are on local disk before it asks.

    ahead = DownloadAhead(sizes, fetch=cache_prefetch, ahead_bytes=100 << 30)
    ahead.start(shard_sequence(shard[anchors[order]]))   # the rank's epoch, in read order
    ahead.reader_at(position)     # or ahead.consumed(shard_id) on each open
    ahead.protected               # shard ids the window holds: the cache does not evict them

`fetch(shard_id)` downloads one shard if there is room (a path), or returns None when there is
no room now; the thread then waits a little and tries again once the reader has moved on. An
error in `fetch` is kept in `errors` and skipped: the reader's own open of that shard retries
and raises it. The window is counted in bytes from the reader's position: the shards between
it and the first position past `ahead_bytes` (the first one always, however large) are fetched
and protected from eviction; what lies behind the reader may be evicted.

Progress comes from one of two places: `reader_at(position)` (the loader says it per batch,
because reads in DataLoader workers are not seen by this process; once called, opens no longer
move the position: a batch opens its shards in file order, not download order), or else
`consumed(shard_id)` on every open, which moves the position to that shard's next occurrence.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

POLL_S = 0.1  # how long the thread waits before asking again for room


def shard_sequence(shard_of_each_read: Sequence[int]) -> list[int]:
    """The order in which shards are needed, from the shard of every sample read in order (e.g.
    `shard[anchors[order]]` of one rank's epoch): consecutive repeats collapsed, later returns to
    a shard kept, which is what `DownloadAhead.start` (`ShardCache.download_ahead`) takes."""
    a = np.asarray(shard_of_each_read, np.int64)
    return a[np.r_[True, a[1:] != a[:-1]]].tolist() if a.size else []


class DownloadAhead:
    """One download thread for one process (see the module docstring)."""

    def __init__(self, sizes: Sequence[int], fetch: Callable[[int], Any], ahead_bytes: int):
        self.sizes, self.fetch, self.ahead_bytes = list(sizes), fetch, int(ahead_bytes)
        self._cv = threading.Condition()
        self._order: list[int] = []
        self._pos = 0  # position in the order of the shard the reader uses now
        self._next = 0  # next position the download thread fetches
        self.protected: set[int] = set()  # shard ids inside the window (replaced, never mutated)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._driven = False  # reader_at() reports progress; opens do not
        self.errors: list[BaseException] = []

    def start(self, shard_ids_in_order: Sequence[int]) -> None:
        """Download these shards in this order (repeats allowed); a new call replaces the order."""
        order = [int(s) for s in shard_ids_in_order]
        with self._cv:
            self._order, self._pos, self._next, self._closed = order, 0, 0, False
            self._update_protected()
            self._cv.notify_all()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="shard-download", daemon=True)
            self._thread.start()

    def reader_at(self, position: int) -> None:
        """The reader has reached `position` of the current order."""
        with self._cv:
            self._driven = True
            self._pos = min(max(int(position), 0), len(self._order))
            self._next = max(self._next, self._pos)
            self._update_protected()
            self._cv.notify_all()

    def consumed(self, shard_id: int) -> None:
        """The reader opened `shard_id`: move the position to its next occurrence in the order
        (nothing when `reader_at` drives the position, or the shard is not ahead in the order)."""
        if not self._order or self._driven:
            return
        with self._cv:
            try:
                pos = self._order.index(shard_id, self._pos)
            except ValueError:
                return
            self._pos = pos
            self._next = max(self._next, pos)
            self._update_protected()
            self._cv.notify_all()

    def close(self) -> None:
        """Stop the thread (a download in flight finishes, or is cleaned by the cache's next user)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _window_end(self) -> int:
        """First order position past the bytes budget counted from the reader's position."""
        total, seen, j = 0, set(), self._pos
        while j < len(self._order):
            sid = self._order[j]
            if sid not in seen:
                total += self.sizes[sid]
                if total > self.ahead_bytes and j > self._pos:
                    break
                seen.add(sid)
            j += 1
        return j

    def _update_protected(self) -> None:
        self.protected = set(self._order[self._pos:self._window_end()])

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and self._next >= self._window_end():
                    self._cv.wait()
                if self._closed:
                    return
                sid = self._order[self._next]
            try:
                fetched = self.fetch(sid)
            except Exception as e:  # noqa: BLE001 - the reader's own call retries and raises it
                self.errors.append(e)
                fetched = True  # move on: the reader's own call will raise it
            with self._cv:
                if fetched is None:  # no room yet: try again once the reader has moved on (or soon)
                    self._cv.wait(POLL_S)
                elif self._next < len(self._order) and self._order[self._next] == sid:
                    self._next += 1

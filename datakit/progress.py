"""Progress on stderr: a tqdm bar on a terminal, a plain line every few seconds anywhere else.

    with progress_bar(frames, f"convert {src.name}", enabled=cfg.progress, waiting="reading the first episode") as bar:
        bar.update(n)   # the engines: frames written (bar.n: how many so far)

A bar redraws itself in place with `\\r`, every 0.1 s. Into a file, a pipe or a CI log (`datakit
convert ... 2> convert.log`, `| tee`) those redraws pile up as one endless line, so when stderr is
not a terminal the progress is a plain line every `LINE_EVERY_S` seconds, and one at the end.

Before the first frame the conversion can wait seconds (the workers start, the first episode's
table is read and its videos opened and sought: a large v3.0 file holds many episodes): the bar
says what it waits for (`waiting`) instead of showing 0% without a word, and the plain lines start
with it. From the first frame on, both count frames as they are written (convert/episode.py reports
every frame; the engines in convert/engines/ poll their workers' counts every 0.2 s).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

from tqdm import tqdm

LINE_EVERY_S = 10.0  # between two plain lines (not a terminal); a ten-minute conversion logs ~60 lines


class Progress(Protocol):
    """What the engines use of a bar: `update(frames)` and `n`, the count so far."""

    n: int

    def update(self, n: int = 1) -> Any: ...


class _Bar(tqdm):
    """tqdm with a word while nothing has been counted yet (`waiting`), dropped at the first count."""

    def update(self, n: float | None = 1) -> bool | None:
        if self.n == 0 and n and getattr(self, "postfix", None):  # a disabled bar has none
            self.set_postfix_str("", refresh=False)
        return super().update(n)


class LineProgress:
    """Plain lines, no `\\r`: one at the start, one every `every` seconds while counts come in, one at the end."""

    def __init__(self, total: int, desc: str, unit: str, file: TextIO, *, waiting: str = "",
                 every: float | None = None):
        self.n, self.total, self.desc, self.unit, self.file = 0, total, desc, unit, file
        self.every = LINE_EVERY_S if every is None else every
        self._t0 = self._last = time.monotonic()
        self._say(waiting)

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.every:
            self._say()

    def close(self) -> None:
        elapsed = time.monotonic() - self._t0
        rate = f", {self.n / elapsed:.0f} {self.unit}s/s" if elapsed > 0 else ""
        self._say(f"done in {tqdm.format_interval(elapsed)}{rate}")

    def _say(self, note: str = "") -> None:
        self._last = now = time.monotonic()
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        if not note and self.n:
            elapsed = now - self._t0
            left = elapsed / self.n * (self.total - self.n)
            note = f"{self.n / elapsed:.0f} {self.unit}s/s, about {tqdm.format_interval(left)} left"
        self.file.write(f"{self.desc}: {self.n}/{self.total} {self.unit}s{pct}{', ' + note if note else ''}\n")
        self.file.flush()

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(total: int, desc: str, *, enabled: bool, unit: str = "frame", waiting: str = "",
                 file: TextIO | None = None) -> tqdm | LineProgress:
    """A bar on a terminal, plain lines elsewhere, nothing (a disabled tqdm) when not `enabled`."""
    file = file or sys.stderr
    if enabled and not file.isatty():
        return LineProgress(total, desc, unit, file, waiting=waiting)
    tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked after this
    return _Bar(total=total, unit=unit, desc=desc, disable=not enabled, dynamic_ncols=True, smoothing=0.1,
                file=file, postfix=waiting or None)

"""Run a frame iterator on its own thread, a few items ahead of the consumer.

Each camera of an episode decodes (and resizes) on its own thread while the main thread packs
and writes frames: decoders and torch release the GIL in their C code, so the stages overlap on
spare cores. Errors are re-raised in the consumer; closing the consumer stops the thread.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

T = TypeVar("T")
_END = object()


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put `item` unless the consumer gave up (`stop`): never blocks forever on a full queue."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def in_background(items: Iterator[T], depth: int = 4, name: str = "background") -> Iterator[T]:
    """Yield `items`, produced on a thread up to `depth` ahead. The producer's end, and any
    error it raises, are handed over like items: when the consumer stops early (another
    camera ran short, an output error, Ctrl-C) the producer sees `stop` and ends too."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                if not _put(q, item, stop):
                    return
            _put(q, _END, stop)
        except BaseException as e:  # handed to the consumer, raised there
            _put(q, e, stop)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()

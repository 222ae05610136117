"""argparse `type=` functions that refuse an absurd value while the command line is parsed, so the
error names the flag (`datakit plan: error: argument --h2d-gbps: must be a finite number > 0, got
'0'`, exit 2) instead of a ZeroDivisionError, or a plan printed from nonsense with exit 0.

    p.add_argument("--h2d-gbps", type=positive(float))
    p.add_argument("--ignore", type=names_of(FINDING_KINDS, "finding kind"), action="append")
    p.add_argument("--shard-size", type=byte_size)   # "1XB": not a size: '1XB' (... 1GiB, 256MiB ...)
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T", int, float)


def positive(parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse` (int, float, a size parser), then refuse anything but a finite number > 0."""

    def check(text: str) -> T:
        try:
            value = parse(text)
        except (ValueError, OverflowError):  # OverflowError: int(float("inf")) in a size parser
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
        return value

    check.__name__ = f"positive {getattr(parse, '__name__', 'number')}"
    return check


SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SIZE_FORM = "a number of bytes, or with a unit K, M, G or T (powers of 1024): 1GiB, 256MiB, 1.5G, 4096, 1e9"
_SIZE = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(?:e\+?\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def byte_size(text: str) -> int:
    """A size in bytes > 0, as people write it: 1GiB, 1GB, 1g, 256MiB, 4096, 1e9 (K/M/G/T are powers
    of 1024 with or without the i); anything else is refused saying what a size looks like."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} ({SIZE_FORM})")
    value = int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (a worker count where 0 means in this process)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def names_of(allowed: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A comma list of names, each one of `allowed` (a typo would otherwise match nothing, silently)."""
    known = sorted(set(allowed))

    def check(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r} (known: {', '.join(known)})")
        return names

    check.__name__ = f"{what} list"
    return check

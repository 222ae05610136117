"""The `trainkit` command (placeholder until the trainer issue lands)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("trainkit: no commands yet; the FSDP2 trainer is tracked in the issue tracker", file=sys.stderr)
    return 1

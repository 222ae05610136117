"""`datakit info OUT [--json]`: describe a converted output folder (its index, checked against
checksums.json as every reader loads it): source, episodes, frames, shards, bytes, colour layout,
and per camera its size and slot status."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("info", help="describe a converted output folder")
    p.add_argument("out", type=Path)
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return p


def run(args) -> int:
    from datakit.commands.summary import print_summary
    from datakit.shards.index import load_index

    index = load_index(args.out)
    if args.json:
        print(json.dumps(index.info(), indent=1))
    else:
        print_summary(index)
    return 0

"""The output-folder protocol: OUT holds one conversion and nothing else.

OUT is empty, absent, or holds our own files only (shards, index files, the staging folder);
an unfinished conversion is resumed only with the same options.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from datakit.convert.journal import STAGING
from datakit.durable import write_atomic
from datakit.errors import OutputError
from datakit.shards.index import CHECKSUMS_NAME, FRAMES_NAME, MANIFEST_NAME, is_finished, load_index

OPTIONS_NAME = "options.json"


def is_ours(name: str) -> bool:
    """A file name that a conversion writes into OUT (final or temporary)."""
    stem = name.split(".", 1)[0] if name.endswith(".tmp") else None  # index.json.<pid>.tmp, frames.arrow.tmp
    return name in (STAGING, MANIFEST_NAME, FRAMES_NAME, CHECKSUMS_NAME) or stem in ("index", "frames", "checksums") or (
        name.startswith("shard-") and (name.endswith(".tar") or name.endswith(".tar.tmp"))
    )


def prepare_output(out: Path, options: dict) -> bool:
    """Check OUT is empty, ours with the same options, or absent; returns True if already complete."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    others = sorted(n for n in os.listdir(out) if not is_ours(n))
    if others:
        raise OutputError(f"{out}: output folder holds other files ({', '.join(others[:3])}); use an empty or new folder")
    if is_finished(out):
        try:
            idx = load_index(out)
        except Exception as e:
            raise OutputError(f"{out / MANIFEST_NAME}: unreadable index ({e})") from None
        if idx.options != options:
            raise OutputError(f"{out}: holds a finished conversion made with other options {idx.options}")
        return True
    staging = out / STAGING
    staging.mkdir(exist_ok=True)
    opt_path = staging / OPTIONS_NAME
    if opt_path.exists():
        if json.loads(opt_path.read_text()) != options:
            raise OutputError(f"{out}: holds an unfinished conversion made with other options; "
                              f"rerun with those ({opt_path}) or use a new folder")
    else:
        write_atomic(opt_path, json.dumps(options, sort_keys=True).encode())
    return False

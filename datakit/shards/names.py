"""The file names a conversion or an encode writes into OUT, spelled once.

Every module that writes, reads, uploads, checks or cleans an output folder takes its names from
here (as LeRobot keeps its path templates in one module); `datakit/source_paths.py` is the same for
the sources' paths. What OUT holds when finished:

  OUT/shard-000000.tar ...   the frames (or clip tensors), `SHARD_PATTERN`
  OUT/frames.arrow           the frame (or clip) table, `FRAMES_NAME`
  OUT/index.json             the manifest, `MANIFEST_NAME`
  OUT/checksums.json         sha256 of the two above, written last: present = finished, `CHECKSUMS_NAME`
  OUT/options.json, OUT/source.json   the run's options and the source's fingerprint (resume)
and while a run works: OUT/.datakit.lock and OUT/.datakit-staging/shard-000000.journal ...
"""
from __future__ import annotations

import re

MANIFEST_NAME = "index.json"
FRAMES_NAME = "frames.arrow"
CHECKSUMS_NAME = "checksums.json"  # sha256 of index.json and frames.arrow; written last = finished
INDEX_FILES = (FRAMES_NAME, MANIFEST_NAME, CHECKSUMS_NAME)  # in the order they are written (the last = finished)
SHARD_PATTERN = "shard-{index:06d}.tar"
SHARD_NAME = re.compile(r"shard-[0-9]{6,}\.tar")  # what an index may name as a shard
SHARD_TMP_GLOB = "shard-*.tar.tmp"  # a shard its writer has not finished
OPTIONS_NAME = "options.json"
FINGERPRINT_NAME = "source.json"
LOCK_NAME = ".datakit.lock"
STAGING = ".datakit-staging"  # OUT/.datakit-staging/: journals and task scratch, removed when finished
JOURNAL = "shard-{index:06d}.journal"  # in STAGING: what one finished shard holds
JOURNAL_GLOB = "shard-*.journal"

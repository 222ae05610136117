"""Shared test setup."""
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
# make `import datakit` work without installing the project
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the shared helpers and fixtures (tests/fixtures/), imported by name: `from loader_fixtures import shards_rgb`
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
# test modules that tests in other folders import by name (a family's tiny batch, an exported checkpoint,
# a run's helpers), so that any one folder runs alone: `pytest tests/trainkit/models/gr00t`
for _room in ("trainkit/models/pi05", "trainkit/models/gr00t", "trainkit/models/dreamzero", "trainkit/weights",
              "trainkit/train"):
    sys.path.append(str(Path(__file__).resolve().parent / _room))

# the object-storage fixtures, defined once for the session: imported into several test modules,
# each module would start its own S3 server while s3fs's cached filesystem kept the first one
from storage_fixtures import bucket, converted, s3_server, uploaded  # noqa: E402,F401
# the doctor tests' pristine datasets, generated once for the session and shared by their modules
from doctor_fixtures import bases, dataset  # noqa: E402,F401

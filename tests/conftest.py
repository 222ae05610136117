"""Shared test setup."""
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
# make `import datakit` work without installing the project
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the object-storage fixtures, defined once for the session: imported into several test modules,
# each module would start its own S3 server while s3fs's cached filesystem kept the first one
from storage_fixtures import bucket, converted, s3_server, uploaded  # noqa: E402,F401
# the doctor tests' pristine datasets, generated once for the session and shared by their modules
from doctor_fixtures import bases, dataset  # noqa: E402,F401

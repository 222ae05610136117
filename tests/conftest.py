"""Shared test setup."""
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
# make `import datakit` work without installing the project
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

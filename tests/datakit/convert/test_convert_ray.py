"""`datakit convert --engine ray` (the cases in ray_convert_cases.py), run by pytest in a process of
their own.

`ray.init` makes the test process a Ray driver, and a process that has been one no longer forks
safely: in two clean-clone CI runs of 2026-12-08 a DataLoader worker forked later in the same
pytest-xdist process aborted in Ray's C++ (`Unhandled exception: St12system_error. what(): Invalid
argument`, raised under ray/_raylet.so's terminate handler in a thread of the child), failing
whichever forking test ran there next (tests/datakit/storage/test_cache_limit.py,
test_remote_features.py). Trainers never import Ray; the tests now keep it out of the other tests'
processes too."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).with_name("ray_convert_cases.py")
pytestmark = pytest.mark.timeout(900)


def test_ray_convert_cases_pass_in_their_own_process():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(CASES)],
                          cwd=ROOT, capture_output=True, text=True, timeout=880)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 5, out[-3000:]  # the cases ran (a collection error says 0)
    print(out[-2000:])

"""`datakit convert --engine ray` (the cases in ray_convert_cases.py), run by pytest in a process of
their own.

`ray.init` makes the test process a Ray driver, with Ray's threads and terminate handler, for the rest
of that pytest-xdist process. In one clean-clone CI run of 2026-12-08 a DataLoader worker forked later
in such a process aborted under ray/_raylet.so's terminate handler (`St12system_error ... Invalid
argument`); the same abort came without Ray in two other runs (tests/datakit/storage/
test_forked_workers_isolated.py), so Ray is not its whole cause, but a driver's state stays out of the
other tests' processes. Trainers never import Ray (docs/convert.md: call the Ray engine from a process
of its own)."""
from __future__ import annotations

from pathlib import Path

import pytest

from own_process import assert_cases_pass_alone

pytestmark = pytest.mark.timeout(900)


def test_ray_convert_cases_pass_in_their_own_process():
    assert_cases_pass_alone(Path(__file__).with_name("ray_convert_cases.py"), least=5, timeout_s=880)

"""bench_loader_gpu.py's `switch_0.5ms` variant sets the GIL switch interval for its measurement alone
and puts the interpreter's back, also when the measurement raises; the other variants leave it."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "data"))
import bench_loader_gpu  # noqa: E402


def test_the_switch_variant_sets_the_interval_and_restores_it():
    before = sys.getswitchinterval()
    with bench_loader_gpu.switch_interval("switch_0.5ms"):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), bench_loader_gpu.switch_interval("switch_0.5ms"):
        raise RuntimeError("a measurement failed")
    assert sys.getswitchinterval() == before
    with bench_loader_gpu.switch_interval("default"):
        assert sys.getswitchinterval() == before

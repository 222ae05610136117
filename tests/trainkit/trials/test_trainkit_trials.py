"""trainkit/trials/run.py: one run per process, its error as a typed record, a hard time limit.

Oracles: tomllib reads back every `--set` text the runner writes; exceptions of known kinds
(torch's OOM, a Dynamo/Inductor error, a trainkit config error) are classified as what they are;
a run refused for a bad model field carries the message `trainkit run` prints; a run stopped at
its limit leaves no process of its group behind.
"""
from __future__ import annotations

import os
import tomllib

import pytest
import torch

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.errors import ConfigError
from datakit.toml_values import toml_value
from trainkit.trials.run import Trial, error_kind, run_trial
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("value", [True, 3, 1e-4, float("inf"), "split", "a \"quoted\" path",
                                   ["observation.images.top", ""], {"vision_blocks": 4, "lm_layers": 1}, {}])
def test_overlay_values_are_toml(value):
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


def test_errors_are_classified_by_their_exception():
    from torch._dynamo.exc import BackendCompilerFailed

    def raised_from(outer: BaseException, inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as e:
                raise outer from e
        except BaseException as e:
            return e

    assert error_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    # an OOM inside a compiled region arrives wrapped by Dynamo: still an OOM
    assert error_kind(raised_from(RuntimeError("backend failed"), torch.OutOfMemoryError("x"))) == "oom"
    assert error_kind(BackendCompilerFailed(lambda: None, RuntimeError("inductor: no kernel"), None)) == "compile_error"
    assert error_kind(ConfigError("parallel.fp8", "needs CUDA")) == "refused"
    assert error_kind(ZeroDivisionError("float division by zero")) == "crash"


def test_a_refused_run_is_recorded_and_a_slow_one_stopped(shards_rgb, tmp_path):  # noqa: F811
    base = (f"data.shards={shards_rgb}", "data.num_workers=0")
    bad = run_trial(Trial(config=TINY, out_dir=tmp_path / "bad", overrides=base, overlay={"model.lm_depth": -1},
                          name="bad"))
    assert (bad.status, bad.returncode, bad.name) == ("refused", 2, "bad")
    assert bad.error.type == "ModelConfigError" and bad.error.rank == 0
    assert bad.error.message == "Pi05Config.lm_depth must be a positive int, got -1"
    assert "trainkit: Pi05Config.lm_depth must be a positive int" in bad.log.read_text()
    assert bad.summary is None and bad.losses == {}

    slow = run_trial(Trial(config=TINY, out_dir=tmp_path / "slow", overrides=(*base, "train.steps=100000"),
                           timeout_s=3.0))
    assert slow.status == "timeout" and slow.returncode is None and slow.error.kind == "timeout"
    assert slow.wall_s < 3.0 + 15  # SIGTERM, then SIGKILL after the grace period at the latest
    with pytest.raises(ProcessLookupError):  # the whole group is gone
        os.killpg(slow.pid, 0)

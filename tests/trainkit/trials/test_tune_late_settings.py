"""`trainkit tune` skips a setting that cannot finish in the time left and says so (issue 35, item 7).
Before the fix the check was the mean wall time of every run so far: after two short eager runs and
compiled ones of 40 s, the mean (30 s) let a compiled setting start with 40 s left, where the budget's
end stopped it ("cut": counts for nothing), and said nothing of the settings never started.

The runner is the fake GPU of tests/trainkit/trials/test_trainkit_tune.py on a fake clock: eager runs take 10 s,
compiled ones 40 s, and a run longer than its time limit is a time-out (as run_trial's limit does).
"""
from __future__ import annotations

import dataclasses

from test_trainkit_tune import SPACE, Clock, Scripted, _cfg
from trainkit.trials.run import TrialError, TrialResult
from trainkit.trials.tune import base_setting, candidates, search
from trainkit.trials.tune_report import format_table
from trainkit_harness import TINY

WALL = {False: 10.0, True: 40.0}


class Timed(Scripted):
    def __call__(self, trial):
        wall = WALL[dict(trial.overlay)["parallel.compile"]]
        if wall > trial.timeout_s:  # stopped by its limit, as run_trial stops it
            self.clock.now += trial.timeout_s
            return TrialResult(name=trial.name, status="timeout", error=TrialError(kind="timeout", type="Timeout",
                               message="limit"), returncode=-9, pid=0, wall_s=trial.timeout_s, out_dir=trial.out_dir)
        self.wall_s = wall
        return super().__call__(trial)


def test_a_compiled_setting_that_cannot_finish_is_not_started_and_eager_ones_still_run(tmp_path, monkeypatch):
    from trainkit.trials import tune

    clock = Clock()
    monkeypatch.setattr(tune, "time", clock)
    cfg = _cfg()
    space = dataclasses.replace(SPACE, compile=(False, True))
    gpu = Timed(cfg, first=[5.0] * 64, again=[5.0] * 64, clock=clock)
    gpu.truth = {c.setting: c.static_gib + 1.3 * c.dynamic_gib for c in candidates(cfg, space, 1)}
    cap = max(gpu.truth.values())
    result = search(cfg, TINY, cap_gib=cap, budget_s=130, out=tmp_path, space=space, runner=gpu, top=1, repeats=1,
                    trial_timeout_s=300, base=base_setting(cfg, ["vision_blocks", "lm_layers"]))
    statuses = [(r.setting.compile, r.status) for r in result.runs]
    assert all(status == "ok" for _, status in statuses), statuses  # nothing cut
    assert (True, "ok") in statuses and statuses[-1][0] is False  # compiled ones ran, then eager ones still
    assert clock.now <= 130
    assert any("compiled setting(s) not started: each needs ~40 s" in line for line in result.late), result.late
    assert any(line in format_table(result, cap) for line in result.late)

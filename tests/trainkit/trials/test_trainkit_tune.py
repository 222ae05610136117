"""`trainkit tune` (trainkit/trials/tune.py, tune_report.py) on tiny presets.

Oracles: a fake GPU whose peak for each setting the test defines (1.3x the estimate's
micro-batch part, as a model that under-counts activations), so "over the cap" is known without
the code under test; injected failures; tomllib and `trainkit run` itself for the overlay. One test
runs real trials (one process each, trainkit/trials/run.py) end to end on CPU.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.cli import main
from trainkit.config import load_config
from trainkit.trials.run import Trial, TrialError, TrialResult
from trainkit.trials.tune import Space, base_setting, candidates, search
from trainkit.trials.tune_report import write_outputs
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(180)

TRUE_SCALE = 1.3  # the fake GPU keeps 1.3x what the estimate's micro-batch part says
SPACE = Space(micro_batches=(1, 2, 4, 8, 16, 32, 64, 128), strides=(0, 1), groups=(1,), compile=(False,))


def _cfg():
    return load_config(TINY, ["data.shards=unused", "output.dir=unused"])


class FakeGPU:
    """A runner: every trial 'runs' at once; its peak is static + TRUE_SCALE x dynamic; trials
    numbered in `fail` fail with that status instead."""

    def __init__(self, cfg, fail: dict[int, str] | None = None):
        self.truth = {c.setting: c.static_gib + TRUE_SCALE * c.dynamic_gib for c in candidates(cfg, SPACE, 1)}
        self.fail, self.trials = fail or {}, []

    def __call__(self, trial: Trial) -> TrialResult:
        self.trials.append(trial)
        setting = next(s for s in self.truth if s.overlay() == dict(trial.overlay))
        status = self.fail.get(len(self.trials) - 1)
        if status:
            return TrialResult(name=trial.name, status=status, error=TrialError(kind=status, type="Injected",
                               message=f"injected {status}"), returncode=1, pid=0, wall_s=0.1, out_dir=Path(trial.out_dir))
        summary = {"steady": {"samples_per_s_gpu": 100.0 * setting.micro_batch / (setting.micro_batch + 4),
                              "peak_mem_gib": self.truth[setting]}}
        return TrialResult(name=trial.name, status="ok", error=None, returncode=0, pid=0, wall_s=0.1,
                           out_dir=Path(trial.out_dir), summary=summary)

    def run_settings(self):
        return [next(s for s in self.truth if s.overlay() == dict(t.overlay)) for t in self.trials]


def test_settings_over_the_cap_are_never_run(tmp_path):
    cfg = _cfg()
    gpu = FakeGPU(cfg)
    cap = sorted(gpu.truth.values())[len(gpu.truth) // 2]  # half the space is truly over it
    result = search(cfg, TINY, cap_gib=cap, budget_s=60, out=tmp_path, space=SPACE, runner=gpu, gpu_gib=2 * cap)
    ran = gpu.run_settings()
    assert len(ran) >= 3 and result.scale == pytest.approx(TRUE_SCALE, rel=1e-3)
    # after the first (calibrating) run, every run fits the cap on the fake GPU
    assert all(gpu.truth[s] <= cap for s in ran[1:]), [(s.label(), gpu.truth[s]) for s in ran]
    over = [s for s, peak in gpu.truth.items() if peak > cap]
    assert over and not set(over) & set(ran[1:]) and result.never_run_over_cap >= len(over) - 1
    assert max(s.micro_batch for s in ran) < 128  # the largest micro-batch never fits


def test_the_first_run_is_the_configs_own_setting_under_the_cap(tmp_path):
    cfg = _cfg()  # pi05_tiny: micro-batch 4, ac_stride {vision 2, lm 1}, group {vision 2, lm 1}, eager
    base = base_setting(cfg, ["vision_blocks", "lm_layers"])
    gpu = FakeGPU(cfg)
    at = {c.setting.micro_batch: c.peak(1.0) for c in candidates(cfg, SPACE, 1)
          if dataclasses.replace(c.setting, micro_batch=4) == base}
    cap = at[2]  # the estimate fits at micro-batch 2, not at the config's 4
    assert at[4] > cap
    result = search(cfg, TINY, cap_gib=cap, budget_s=60, out=tmp_path, space=SPACE, runner=gpu, base=base)
    assert gpu.run_settings()[0] == dataclasses.replace(base, micro_batch=2) == result.reference


def test_an_injected_failure_is_recorded_and_the_search_goes_on(tmp_path):
    cfg = _cfg()
    gpu = FakeGPU(cfg, fail={1: "oom", 2: "compile_error"})
    cap = max(gpu.truth.values())  # everything fits the cap: only the OOM prunes
    result = search(cfg, TINY, cap_gib=cap, budget_s=60, out=tmp_path, space=SPACE, runner=gpu, gpu_gib=cap)
    statuses = [r.status for r in result.runs]
    assert statuses[1:3] == ["oom", "compile_error"] and len(statuses) > 3 and statuses[3] == "ok"
    assert result.runs[1].error == "Injected: injected oom"
    # the OOM corrected the model: the setting is now estimated at the GPU's memory at least, and
    # every later run was estimated under the cap with the corrected model when it started
    oom = next(c for c in candidates(cfg, SPACE, 1) if c.setting == result.runs[1].setting)
    assert oom.static_gib + TRUE_SCALE * oom.dynamic_gib < cap  # it would have fitted
    assert oom.peak(result.scale) >= cap * (1 - 1e-6) and result.scale > TRUE_SCALE
    assert all(r.estimate_gib <= cap + 5e-7 for r in result.runs[2:])  # estimate_gib is rounded to 1e-6 GiB
    assert result.best is not None and result.best.status == "ok"
    write_outputs(result, tmp_path, command="test", config=TINY, cap_gib=cap, budget_s=60, world_size=1,
                  base=base_setting(cfg, ["vision_blocks", "lm_layers"]))
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert {r["status"] for r in doc["runs"]} >= {"ok", "oom", "compile_error"}
    assert doc["best"]["samples_per_s"] == max(r.samples_per_s for r in result.runs if r.status == "ok")
    best = tomllib.loads((tmp_path / "best.toml").read_text())
    assert best["train"]["micro_batch"] == result.best.setting.micro_batch
    assert best["parallel"]["ac_stride"] == dict(result.best.setting.ac_stride)


def test_tune_end_to_end_repeats_and_prints_a_command_that_trainkit_run_accepts(shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                                monkeypatch):
    """Real trials (one process each) on a space of two settings: each is run twice, A B A B; the
    `trainkit run` line printed last, run as printed (shlex-split, through `main`), trains with the
    overrides tune was given, minus those best.toml replaces (ac_stride, group: the overlay wins)."""
    out = tmp_path / "tune"
    sets = [f"data.shards={shards_rgb}", "data.num_workers=0", "train.steps=3", "parallel.ac_stride={}",
            "parallel.group={}", "output.dir=runs/my run"]
    code = main(["tune", str(TINY), "--memory-cap", "1", "--budget-min", "3", "--out", str(out), "--steps", "3",
                 "--micro-batches", "2", "--strides", "0", "--groups", "1", "--compile", "off",
                 *[a for s in sets for a in ("--set", s)]])
    printed = capsys.readouterr().out
    assert code == 0, printed
    doc = json.loads((out / "tune.json").read_text())
    labels = [r["label"] for r in doc["runs"]]
    assert len(set(labels)) == 2 and labels == labels[:2] * 2, labels  # A B A B
    assert [r["repeat"] for r in doc["runs"]] == [0, 0, 1, 1]
    best = doc["best"]
    assert best["status"] == "ok" and len(best["samples"]) == 2 and best["samples_per_s"] > 0
    assert best["spread"] == [min(best["samples"]), max(best["samples"])]
    assert "samples/s/GPU" in printed and "spread" in printed
    command = printed.strip().splitlines()[-1].strip()
    assert command == doc["next_command"] and command.startswith(f"trainkit run {TINY} --overlay ")
    argv = shlex.split(command)
    kept = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert kept == [s for s in sets if not s.startswith(("parallel.ac_stride", "parallel.group"))]
    monkeypatch.chdir(tmp_path)  # output.dir is relative, as the user typed it
    assert main(argv[1:]) == 0
    summary = json.loads((tmp_path / "runs" / "my run" / "summary.json").read_text())
    assert summary["steps_run"] == 3
    overlay = Path(argv[argv.index("--overlay") + 1])
    cfg = load_config(TINY, kept, overlay=overlay)
    assert cfg.train.micro_batch == best["setting"]["train.micro_batch"]
    assert cfg.parallel.ac_stride == best["setting"]["parallel.ac_stride"]
    assert f"# {command}" in overlay.read_text()
    capsys.readouterr()
    bad = tmp_path / "bad.toml"
    bad.write_text(overlay.read_text() + "compil = true\n")  # a typo in the last section, [parallel]
    assert main(["run", str(TINY), "--overlay", str(bad), *[a for s in kept for a in ("--set", s)]]) == 2
    err = capsys.readouterr().err
    assert f"trainkit: {bad}: parallel.compil: unknown key 'compil'" in err, err


def test_an_overlay_section_that_is_not_the_configs_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[trian]\nmicro_batch = 4\n")
    with pytest.raises(Exception, match=f"{bad}: trian: unknown key 'trian'"):
        load_config(TINY, overlay=bad, required=False)


def test_the_search_estimates_what_trainkit_inspect_says(tmp_path):
    """tune builds the model once and estimates every setting from its counts; `trainkit inspect`
    of the config with that setting's keys set must say the same."""
    from trainkit.estimate.inspect import inspect_model
    from datakit.toml_values import toml_value

    cfg = _cfg()
    pool = candidates(cfg, Space(micro_batches=(3, 8), strides=(0, 2), groups=(1, 2)), 1)
    for c in pool[::7]:
        sets = [f"{k}={toml_value(v)}" for k, v in c.setting.overlay().items()]
        peak = inspect_model(load_config(TINY, sets, required=False), world_size=1)["memory"]["peak_gib"]
        assert c.peak(1.0) == pytest.approx(peak, abs=2e-6), c.setting.label()


# Number flags (issue 25, defect 13): inf, nan, negatives and a budget that overflows are refused
# naming the flag, before the output folder is made.
@pytest.mark.parametrize("flag, value", [
    ("--memory-cap", "inf"), ("--memory-cap", "nan"), ("--memory-cap", "-1"), ("--memory-cap", "0"),
    ("--budget-min", "1e308"), ("--budget-min", "inf"), ("--budget-min", "nan"), ("--budget-min", "-5"),
    ("--trial-timeout-s", "inf"), ("--trial-timeout-s", "nan"), ("--trial-timeout-s", "1e300"),
    ("--gpu-memory-gib", "inf"), ("--gpu-memory-gib", "nan"), ("--gpu-memory-gib", "0"), ("--gpu-memory-gib", "-80"),
])
def test_number_flags_that_are_not_finite_and_positive_are_refused(tmp_path, capsys, flag, value):
    out = tmp_path / "tune"
    flags = {"--memory-cap": "1", "--budget-min": "0.01", flag: value}
    code = main(["tune", str(TINY), *[x for kv in flags.items() for x in kv], "--out", str(out), "--micro-batches", "2",
                 "--strides", "0", "--groups", "1", "--compile", "off", "--set", "data.shards=unused"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"trainkit: {flag}: must be a finite number > 0") and err.count("\n") == 1, err
    assert not out.exists()


def _strict_json(path: Path) -> dict:
    def refuse(token: str) -> None:
        raise AssertionError(f"{path}: {token} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_tune_json_is_strict_and_a_nan_speed_is_never_best(tmp_path):
    """A run whose samples/s is NaN (a summary of a run that measured nothing) is written as null
    and never chosen as best; the file parses under a reader that refuses NaN / Infinity."""
    cfg = _cfg()

    class NanFirst(FakeGPU):
        def __call__(self, trial):
            result = super().__call__(trial)
            if len(self.trials) == 1:
                result.summary["steady"]["samples_per_s_gpu"] = float("nan")
            return result

    gpu = NanFirst(cfg)
    cap = max(gpu.truth.values())
    result = search(cfg, TINY, cap_gib=cap, budget_s=60, out=tmp_path, space=SPACE, runner=gpu, gpu_gib=cap)
    assert len(result.runs) > 1 and result.best is not None and result.runs[0] not in result.best.runs
    result.runs[1].peak_gib = float("inf")
    write_outputs(result, tmp_path, command="test", config=TINY, cap_gib=cap, budget_s=60, world_size=1, base=None)
    doc = _strict_json(tmp_path / "tune.json")
    by_dir = {r["out_dir"]: r for r in doc["runs"]}
    assert by_dir[result.runs[0].out_dir]["samples_per_s"] is None
    assert by_dir[result.runs[1].out_dir]["peak_gib"] is None
    assert doc["best"]["out_dirs"] == [r.out_dir for r in result.best.runs] and doc["stopped"] is None


# Repeats, spread and ties (issue 26, item 9). Oracles: runners whose speeds the test scripts, a
# clock the runner advances, and the expected order and ties worked out here by hand.
class Scripted(FakeGPU):
    """FakeGPU whose k-th distinct setting runs at first[k] samples/s the first time and again[k]
    on a repeat (1.0 for settings past the script); `wall_s` per run on `clock` when given."""

    def __init__(self, cfg, first: list[float], again: list[float], wall_s: float = 0.1, clock=None,
                 fail: dict[int, str] | None = None):
        super().__init__(cfg, fail)
        self.first, self.again, self.wall_s, self.clock, self.order = first, again, wall_s, clock, []

    def __call__(self, trial: Trial) -> TrialResult:
        if self.clock is not None:
            self.clock.now += self.wall_s
        result = super().__call__(trial)
        result.wall_s = self.wall_s
        setting = self.run_settings()[-1]
        seen = setting in self.order
        if not seen:
            self.order.append(setting)
        k = self.order.index(setting)
        if result.ok:
            script = self.again if seen else self.first
            result.summary["steady"]["samples_per_s_gpu"] = script[k] if k < len(script) else 1.0
        return result


def test_the_top_settings_are_run_again_interleaved(tmp_path):
    cfg = _cfg()
    first = [10.0, 40.0, 20.0, 30.0, 50.0]  # by first run: #5 (50), #2 (40), #4 (30) are the top 3
    gpu = Scripted(cfg, first, again=first)
    cap = max(gpu.truth.values())
    result = search(cfg, TINY, cap_gib=cap, budget_s=60, out=tmp_path, space=SPACE, runner=gpu, top=3, repeats=3)
    ran = gpu.run_settings()
    top = [gpu.order[1], gpu.order[3], gpu.order[4]]  # in the order they first ran
    assert ran[-6:] == top + top, "A B C A B C"
    assert len(set(ran[:-6])) == len(ran[:-6])  # every setting once before any repeat
    assert [r.repeat for r in result.runs[-6:]] == [1, 1, 1, 2, 2, 2]
    assert [m.setting for m in result.ranked[:3]] == [gpu.order[4], gpu.order[1], gpu.order[3]]
    assert [len(m.runs) for m in result.ranked[:3]] == [3, 3, 3] and len(result.ranked[3].runs) == 1
    write_outputs(result, tmp_path, command="test", config=TINY, cap_gib=cap, budget_s=60, world_size=1, base=None)
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert len(doc["runs"]) == len(gpu.trials)  # every repeat recorded, in the order run
    assert [r["repeat"] for r in doc["runs"]][-6:] == [1, 1, 1, 2, 2, 2]


def test_the_spread_is_shown_and_a_tie_is_marked(tmp_path):
    cfg = _cfg()
    # medians 45 (40-50), 43.5 (43-44), 30.5 (30-31): #1's slowest run (40) is slower than #2's
    # fastest (44), a tie; #2's slowest (43) beats #3's fastest (31), no tie; the rest ran once at 1.0
    gpu = Scripted(cfg, first=[50.0, 44.0, 30.0], again=[40.0, 43.0, 31.0])
    cap = max(gpu.truth.values())
    result = search(cfg, TINY, cap_gib=cap, budget_s=60, out=tmp_path, space=SPACE, runner=gpu)
    one, two, three = result.ranked[:3]
    assert (one.samples, one.samples_per_s, one.spread) == ([50.0, 40.0], 45.0, (40.0, 50.0))
    assert (two.samples_per_s, two.spread, three.samples_per_s) == (43.5, (43.0, 44.0), 30.5)
    assert (one.tie, two.tie, three.tie) == (True, False, False)
    assert result.best is one and [len(m.runs) for m in result.ranked[3:]] == [1] * (len(result.ranked) - 3)
    table = write_outputs(result, tmp_path, command="test", config=TINY, cap_gib=cap, budget_s=60, world_size=1,
                          base=None, overrides=["data.shards=x"])
    rows = table.splitlines()
    assert rows[0].split()[:5] == ["#", "status", "samples/s/GPU", "spread", "runs"]
    assert rows[1].split()[:5] == ["1", "ok", "45.00", "40.00-50.00", "2"] and "(tie with #2" in rows[1]
    assert rows[2].split()[:5] == ["2", "ok", "43.50", "43.00-44.00", "2"] and "tie" not in rows[2]
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert doc["best"]["samples"] == [50.0, 40.0] and doc["best"]["tie_with_next"] is True
    assert doc["ranked"][1]["spread"] == [43.0, 44.0] and not doc["ranked"][1]["tie_with_next"]
    assert "a tie with #2" in (tmp_path / "best.toml").read_text()
    assert doc["next_command"] == f"trainkit run {TINY} --overlay {tmp_path / 'best.toml'} --set data.shards=x"


class Clock:
    now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_repeats_are_paid_for_inside_the_budget(tmp_path, monkeypatch):
    """Runs of 10 s and a 100 s budget: new settings stop while the time left still holds the top
    three's repeats (6 new ones, then 3 repeats: 90 s); the last repeat, cut by the budget's end,
    is "cut" and counts for nothing."""
    from trainkit.trials import tune

    clock = Clock()
    monkeypatch.setattr(tune, "time", clock)
    cfg = _cfg()
    gpu = Scripted(cfg, first=[5.0, 6.0, 7.0, 8.0, 9.0, 10.0], again=[5.0, 6.0, 7.0, 8.0, 9.0, 10.0], wall_s=10.0,
                   clock=clock, fail={8: "timeout"})
    cap = max(gpu.truth.values())
    result = search(cfg, TINY, cap_gib=cap, budget_s=100, out=tmp_path, space=SPACE, runner=gpu,
                    trial_timeout_s=300)
    assert [r.repeat for r in result.runs] == [0] * 6 + [1] * 3 and clock.now == 90.0
    assert all(t.timeout_s <= 100 - 10 * i for i, t in enumerate(gpu.trials))  # never past the budget
    assert result.runs[-1].status == "cut" and result.runs[-1].setting == gpu.order[5]
    assert result.best.setting == gpu.order[5] and result.best.status == "ok" and result.best.samples == [10.0]
    assert [m.setting for m in result.ranked[:3]] == [gpu.order[5], gpu.order[4], gpu.order[3]]
    assert [len(m.samples) for m in result.ranked[:3]] == [1, 2, 2]


@pytest.mark.parametrize("flags", [["--top", "0"], ["--repeats", "0"], ["--repeats", "-2"]])
def test_top_and_repeats_below_one_are_refused(tmp_path, capsys, flags):
    out = tmp_path / "tune"
    assert main(["tune", str(TINY), "--memory-cap", "1", "--out", str(out), *flags, "--set", "data.shards=unused"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit: --top and --repeats must be >= 1") and err.count("\n") == 1, err
    assert not out.exists()

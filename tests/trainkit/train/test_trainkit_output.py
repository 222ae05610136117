"""What `trainkit run` prints and records on a CPU, against the facts of the run: one tiny run in
this process (one rank, as a newcomer starts it), its stdout and metrics.jsonl.

- MFU: a CPU has no peak FLOP rate, so MFU is n/a, never 0.0%;
- all-gathers: the run counts them as torch.distributed sees them (metrics.CollectiveCounter);
  `trainkit inspect` at world size 1 reports the same count;
- step lines: steps done, as the checkpoints are named; no progress-bar redraws in a log.
"""
import contextlib
import io
import json

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import TINY

from trainkit.cli import main
from trainkit.config import load_config
from trainkit.estimate.inspect import inspect_model

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cpu_run(shards_rgb, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("cpu_run")
    overrides = [f"data.shards={shards_rgb}", f"output.dir={out}", "train.steps=4", "output.log_every=2",
                 "data.num_workers=0", "output.checkpoint_every=2", "output.progress=true"]
    buf, err = io.StringIO(), io.StringIO()  # neither a terminal, as in `trainkit run ... > train.log 2>&1`
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(["run", str(TINY), *[x for o in overrides for x in ("--set", o)]])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"code": code, "stdout": buf.getvalue(), "stderr": err.getvalue(), "lines": lines,
            "intervals": [x for x in lines if x["kind"] == "interval"], "cfg": load_config(TINY, overrides), "out": out}


def test_mfu_is_not_applicable_on_a_cpu(cpu_run):
    assert cpu_run["code"] == 0
    assert [x["mfu"] for x in cpu_run["intervals"]] == [None, None]
    out = cpu_run["stdout"]
    assert out.count("MFU n/a (no peak for this device)") == 2  # both interval lines
    table = [line.split(None, 1) for line in out.splitlines() if line.startswith("  MFU")]  # the summary's row
    assert table == [["MFU", "n/a (no peak for this device)"]], out
    assert "0.0%" not in out
    assert json.loads((cpu_run["out"] / "summary.json").read_text())["steady"]["mfu"] is None


def test_inspect_counts_the_all_gathers_the_run_counts(cpu_run):
    counted = {x["all_gathers_per_step"] for x in cpu_run["intervals"]}
    assert counted == {0}  # one rank: FSDP2 issues no collective
    report = inspect_model(cpu_run["cfg"], world_size=1)
    assert report["fsdp"]["all_gathers_per_step"] == 0
    assert report["fsdp"]["mode"] == "block" and report["fsdp"]["sharded_all_gathers_per_microbatch"] > 0


def test_step_lines_count_as_the_checkpoints_are_named(cpu_run):
    """The terminal said `step 1` for metrics.jsonl's step 1 (the 2nd step) while the checkpoint after
    it is step-000002: the line now says steps done, `2/4`, and metrics.jsonl keeps its 0-based step."""
    said = [line.split("|")[0].split()[1] for line in cpu_run["stdout"].splitlines() if line.startswith("step ")]
    assert said == ["2/4", "4/4"], cpu_run["stdout"]
    names = sorted(p.name for p in (cpu_run["out"] / "checkpoints").iterdir())
    assert names == [f"step-{int(s.split('/')[0]):06d}" for s in said]
    assert [x["step"] for x in cpu_run["intervals"]] == [1, 3]  # on disk as before


def test_no_progress_bar_redraws_in_a_log(cpu_run):
    """output.progress=true with stderr not a terminal: the step lines alone, no tqdm `\r` redraws."""
    assert cpu_run["code"] == 0
    assert "\r" not in cpu_run["stderr"] and "\r" not in cpu_run["stdout"]


def test_the_run_trains_under_data_gil_switch_ms(shards_rgb, tmp_path, monkeypatch):  # noqa: F811
    """data.gil_switch_ms is the interpreter's switch interval while `train` runs, and the old one after
    (control: the default leaves the interpreter's own)."""
    import sys

    from trainkit_harness import tiny_config

    import trainkit.train as train_mod

    seen = []
    monkeypatch.setattr(train_mod, "train", lambda *a, **k: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    train_mod.run(tiny_config(shards_rgb, tmp_path / "a", "data.gil_switch_ms=0.5"))
    train_mod.run(tiny_config(shards_rgb, tmp_path / "b"))
    assert seen == [pytest.approx(0.0005), before] and sys.getswitchinterval() == before

"""`make demo`'s training half (`make demo-train`): the Makefile's own lines, read with `make -n`
and run here in-process: pi05_tiny for the demo's 30 steps from a shard folder written by datakit
convert (the loader fixture: real AV1 -> shards, one camera blank), then tools/demo_check.py.
Oracle: the run's own metrics.jsonl, read back with the stdlib: the loss falls, and summary.json
is there with the run's first and last loss; the check refuses a run whose loss does not fall."""
import importlib.util
import json
import math
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture

ROOT = Path(__file__).resolve().parents[2]
TRAIN_STEPS = 30  # the Makefile's DEMO_STEPS


def _demo_check():
    spec = importlib.util.spec_from_file_location("demo_check", ROOT / "tools" / "demo_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def demo_train_lines(demo_dir: Path) -> list[list[str]]:
    """The recipe of `make demo-train DEMO_DIR=demo_dir`, as argument lists (nothing run)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    out = subprocess.run(["make", "-n", "-s", "--no-print-directory", "demo-train", f"DEMO_DIR={demo_dir}",
                          "VENV=VENV"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


@pytest.mark.timeout(180)
def test_demo_training_loss_falls_and_the_summary_is_written(shards_rgb, tmp_path, monkeypatch):  # noqa: F811
    from trainkit.cli import main as trainkit

    demo = tmp_path / "demo-out"
    demo.mkdir()
    (demo / "shards").symlink_to(shards_rgb)  # where `datakit demo` writes its shards
    out = demo / "train"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"kind": "step", "step": 0, "loss": 99.0}\n')  # a previous demo's run
    rm, run, check = demo_train_lines(demo)
    assert rm == ["rm", "-rf", str(out)] and run[:2] == ["VENV/bin/trainkit", "run"]
    assert check[:2] == ["VENV/bin/python", "tools/demo_check.py"]
    shutil.rmtree(Path(rm[2]))
    monkeypatch.chdir(ROOT)  # the Makefile's paths are relative to the repository
    assert trainkit(run[1:]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines if x["kind"] == "step"]
    assert len(losses) == TRAIN_STEPS and all(math.isfinite(x) for x in losses)  # a fresh run, not appended
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.85 * first, losses
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps_run"], summary["first_loss"], summary["last_loss"]) == (TRAIN_STEPS, losses[0], losses[-1])
    assert _demo_check().main(check[2:]) == 0


def test_the_demo_check_fails_a_run_whose_loss_does_not_fall(tmp_path, capsys):
    check = _demo_check()
    run = tmp_path / "train"
    run.mkdir()

    def plant(losses):
        (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "step", "step": i, "loss": x}) + "\n"
                                                   for i, x in enumerate(losses)))
        (run / "summary.json").write_text(json.dumps({"steps_run": len(losses), "first_loss": losses[0],
                                                      "last_loss": losses[-1]}))

    plant([1.0 - 0.01 * i for i in range(TRAIN_STEPS)])
    assert check.main([str(run), "--steps", str(TRAIN_STEPS)]) == 0
    plant([1.0] * 25 + [1.1] * 5)  # the loss rises at the end
    assert check.main([str(run), "--steps", str(TRAIN_STEPS)]) == 1
    assert "NOT falling" in capsys.readouterr().out
    plant([1.0 - 0.01 * i for i in range(TRAIN_STEPS - 1)] + [math.nan])
    assert check.main([str(run)]) == 1
    plant([1.0 - 0.01 * i for i in range(TRAIN_STEPS)])
    assert check.main([str(run), "--steps", "31"]) == 1  # the run stopped early
    assert "expected 31" in capsys.readouterr().out
    (run / "summary.json").unlink()
    assert check.main([str(run)]) == 1

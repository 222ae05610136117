"""What `trainkit run` prints and records on a CPU, against the facts of the run: one tiny run in
this process (one rank, as a newcomer starts it), its stdout and metrics.jsonl.

- MFU: a CPU has no peak FLOP rate, so MFU is n/a, never 0.0%;
- all-gathers: the run counts them as torch.distributed sees them (metrics.CollectiveCounter);
  `trainkit inspect` at world size 1 reports the same count.
"""
import contextlib
import io
import json

import pytest

from test_loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import TINY

from trainkit.cli import main
from trainkit.config import load_config
from trainkit.estimate.inspect import inspect_model

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cpu_run(shards_rgb, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("cpu_run")
    overrides = [f"data.shards={shards_rgb}", f"output.dir={out}", "train.steps=4", "output.log_every=2",
                 "data.num_workers=0"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["run", str(TINY), *[x for o in overrides for x in ("--set", o)]])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"code": code, "stdout": buf.getvalue(), "intervals": [x for x in lines if x["kind"] == "interval"],
            "cfg": load_config(TINY, overrides), "out": out}


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

"""`trainkit ladder` on pi05_tiny (CPU): rungs in their own processes, parity, failures, refusals, outputs.

The baseline is the tiny config with the CPU-capable switches of the rungs off; the rungs turn
them on again in turn. Oracles: every rung's losses against baseline's (fp32 on CPU: the switches
change how, not what, is computed), each rung's metrics.jsonl read back here for its step time, a
rung that fails (a model whose action channels do not fit the data: refused at launch since the
robot-dims check, issue 26; it crashed in the first forward before) recorded with its error while the ladder goes on without its switch, the CUDA-only rungs refused with the reason, a
switch trainkit or the family lacks skipped with the reason, and the report files parsed back.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.config import load_config
from trainkit.errors import LaunchError
from trainkit.trials.ladder import BY_NAME, LadderSpec, Rung, resolve_rungs, run_ladder
from trainkit.trials.ladder_report import write_report
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(300)

WARMUP, STEPS = 1, 2
OFF = ("data.num_workers=0", "data.prune_slots=false", "parallel.fsdp=root", "parallel.prefetch=false")
BOOM = Rung("boom", "a rung that raises", {"model.action_dim": 1})
MISSING = Rung("missing", "a switch the family lacks", {"model.attention": "split"})


@pytest.fixture(scope="module")
def ladder(shards_rgb, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("ladder")
    spec = LadderSpec(config=TINY, overrides=(f"data.shards={shards_rgb}", *OFF), out=out, warmup=WARMUP,
                      steps=STEPS, profile_steps=0)
    rungs = [BY_NAME["slot_pruning"], BOOM, BY_NAME["block_fsdp"], MISSING,
             BY_NAME["cuda_graphs"], BY_NAME["fp8"]]
    lines: list[str] = []
    results = run_ladder(spec, rungs, cuda=False, echo=lines.append)
    table = write_report(spec, results, {"date": "test", "device": "CPU", "command": "pytest"})
    return spec, {r.name: r for r in results}, lines, table


def _step_time(run_dir: str, warmup: int) -> float:
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [x for x in rows if x["kind"] == "interval" and x["step"] + 1 - x["steps"] >= warmup]
    return sum(x["steps"] * x["step_time_s"] for x in rows) / sum(x["steps"] for x in rows)


def test_rungs_run_in_turn_and_keep_parity(ladder):
    spec, r, _, _ = ladder
    assert [r[n].status for n in ("baseline", "slot_pruning", "block_fsdp")] == ["ok"] * 3
    base = r["baseline"].losses
    assert sorted(base) == list(range(WARMUP + STEPS))
    for name in ("slot_pruning", "block_fsdp"):
        par = r[name].parity
        assert par["ok"] and par["steps"] == WARMUP + STEPS, par
        assert par["value"] == pytest.approx(sum(abs(a - b) for a, b in zip(r[name].losses.values(), base.values()))
                                             / len(base))
        assert r[name].measured.step_time_s == pytest.approx(_step_time(r[name].out_dir, WARMUP))
        assert r[name].gain_base == pytest.approx(r[name].measured.samples_per_s_gpu
                                                  / r["baseline"].measured.samples_per_s_gpu)
    # block_fsdp builds on slot_pruning, not on the rung that failed between them
    assert r["block_fsdp"].applied == {"data.prune_slots": True, "parallel.fsdp": "block"}
    assert r["block_fsdp"].gain_prev == pytest.approx(r["block_fsdp"].measured.samples_per_s_gpu
                                                      / r["slot_pruning"].measured.samples_per_s_gpu)


def test_a_rung_that_raises_is_recorded_and_the_ladder_goes_on(ladder):
    _, r, lines, _ = ladder
    boom = r["boom"]
    assert boom.status == "failed" and boom.measured is None and boom.parity is None
    assert (boom.error.kind, boom.error.type, boom.error.rank) == ("refused", "DataError", 0), boom.error
    assert any(line.startswith("ladder:  2 boom: FAILED (refused: ") for line in lines), lines


def test_cuda_only_rungs_are_refused_and_missing_switches_skipped(ladder):
    _, r, _, _ = ladder
    for name, key in (("cuda_graphs", "parallel.cuda_graphs"), ("fp8", "parallel.float8_modules")):
        assert r[name].status == "refused"
        assert r[name].reason.startswith(f"{key} needs CUDA, and this machine has none"), r[name].reason
    skipped = r["missing"]
    assert skipped.status == "skipped" and skipped.reason == "family 'pi05' has no model.attention (not a field of its config)"


def test_the_report_files(ladder):
    spec, r, _, table = ladder
    doc = json.loads((spec.out / "ladder.json").read_text())
    assert [x["name"] for x in doc["rungs"]] == ["baseline", "slot_pruning", "boom", "block_fsdp",
                                                 "missing", "cuda_graphs", "fp8"]
    assert doc["rungs"][2]["error"]["kind"] == "refused" and doc["settings"]["warmup"] == WARMUP
    md = (spec.out / "ladder.md").read_text()
    assert md.count("\n| ") == 1 + 7 and "parity vs baseline" in md
    for png in ("ladder_waterfall.png", "ladder_losses.png"):
        assert (spec.out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table.splitlines()[0].split()[:3] == ["#", "rung", "status"] and len(table.splitlines()) == 8


def test_rung_names_are_checked():
    assert [x.name for x in resolve_rungs("compile, fp8")] == ["compile", "fp8"]
    assert [x.name for x in resolve_rungs(None)][:3] == ["slot_pruning", "uint8_h2d", "block_fsdp"]
    with pytest.raises(LaunchError, match="unknown rung 'fp16'; known: slot_pruning, uint8_h2d"):
        resolve_rungs("compile,fp16")


def test_rungs_follow_the_keys_that_exist(shards_rgb, tmp_path):  # noqa: F811
    """A rung over a key trainkit or the family has is planned to run (on a CUDA machine too); over one
    it lacks, skipped with the reason, so the rung is picked up the day the key lands."""
    from trainkit.trials.ladder import plan_rung

    spec = LadderSpec(config=TINY, overrides=(f"data.shards={shards_rgb}", *OFF), out=tmp_path, profile_steps=0)
    runs = [Rung("model_key", "a family field", {"model.rope_theta": 5000.0}),
            Rung("parallel_key", "a trainkit key", {"parallel.reshard_after_forward": False}, needs_cuda=True)]
    for rung in runs:
        assert plan_rung(rung, spec, {}, None, cuda=True)[:2] == (None, ""), rung
    status, reason, _ = plan_rung(Rung("new", "a key to come", {"parallel.not_yet": True}), spec, {}, None, cuda=True)
    assert (status, reason) == ("skipped", "trainkit has no parallel.not_yet (yet): the rung runs once the key exists")
    assert plan_rung(BY_NAME["grouping"], spec, {}, None, cuda=True)[:2] == (
        "skipped", "parallel.group comes from the target config; none given (--target OPT.toml)")
    target = load_config(TINY, required=False)  # the tiny config's grouping, over a baseline without one
    spec = LadderSpec(config=TINY, overrides=(*spec.overrides, "parallel.group={}"), out=tmp_path, profile_steps=0)
    assert plan_rung(BY_NAME["grouping"], spec, {}, target, cuda=True) == (None, "", {"parallel.group": target.parallel.group})


def test_cli_refuses_a_foreign_out_folder_and_unknown_rungs(tmp_path, capsys):
    from trainkit.cli import main

    (tmp_path / "notes.txt").write_text("mine")
    assert main(["ladder", str(TINY), "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path}: exists and holds no earlier ladder (ladder.json)" in capsys.readouterr().err
    assert main(["ladder", str(TINY), "--out", str(tmp_path / "new"), "--rungs", "fp16"]) == 2
    assert "--rungs: unknown rung 'fp16'" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


# Number flags and strict JSON (issue 25, defect 13).
@pytest.mark.parametrize("field, flag, value", [
    ("rung_timeout_s", "--rung-timeout", float("inf")), ("rung_timeout_s", "--rung-timeout", float("nan")),
    ("rung_timeout_s", "--rung-timeout", 0.0), ("rung_timeout_s", "--rung-timeout", 1e300),
    ("parity_abs", "--parity-abs", float("nan")), ("parity_abs", "--parity-abs", float("inf")),
    ("parity_abs", "--parity-abs", -1e-3), ("parity_rel", "--parity-rel", float("nan")),
    ("parity_rel", "--parity-rel", -0.5),
])
def test_number_flags_that_are_not_finite_are_refused(tmp_path, field, flag, value):
    with pytest.raises(LaunchError, match=f"^{flag}: must be a finite number"):
        LadderSpec(config=TINY, out=tmp_path, profile_steps=0, **{field: value})


def test_the_cli_refuses_an_endless_rung_timeout_in_one_line(tmp_path, capsys):
    from trainkit.cli import main

    assert main(["ladder", str(TINY), "--rung-timeout", "inf", "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit: --rung-timeout: must be a finite number > 0") and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()


def test_ladder_json_is_strict_json(tmp_path):
    """A diverged loss (NaN) and a non-finite figure are written as null: the file parses under a
    reader that refuses NaN / Infinity, and ladder.md still shows the rung."""
    from trainkit.trials.ladder import Measured, RungResult

    spec = LadderSpec(config=TINY, out=tmp_path, warmup=0, steps=2, profile_steps=0)
    m = Measured(step_time_s=0.5, samples_per_s_gpu=8.0, mfu=float("nan"), peak_mem_gib=float("inf"),
                 data_wait_ms=0.0, exposed_comm_ms=None, idle_ms=None, micro_batch=4)
    base = RungResult(name="baseline", title="baseline", status="ok", sets={}, measured=m, losses={0: 1.0, 1: 0.9})
    rung = RungResult(name="compile", title="torch.compile", status="ok", sets={"parallel.compile": True}, measured=m,
                      losses={0: 1.0, 1: float("nan")}, gain_prev=1.0, gain_base=1.0,
                      parity={"rule": "mean |diff|", "value": float("nan"), "tolerance": 1e-3, "ok": False, "steps": 2})
    write_report(spec, [base, rung], {"date": "test", "device": "CPU", "command": "pytest"})

    def refuse(token: str) -> None:
        raise AssertionError(f"ladder.json: {token} is not JSON")
    rungs = json.loads((tmp_path / "ladder.json").read_text(), parse_constant=refuse)["rungs"]
    assert rungs[1]["losses"] == {"0": 1.0, "1": None} and rungs[1]["parity"]["value"] is None
    assert rungs[0]["measured"]["mfu"] is None and rungs[0]["measured"]["peak_mem_gib"] is None
    assert "| compile | ok |" in (tmp_path / "ladder.md").read_text()

"""`output.tracker`: the rows of metrics.jsonl, also in TensorBoard or wandb (trainkit/observe/trackers.py).

Oracles: metrics.jsonl itself (stdlib json) against what an independent reader finds in the
tracker's files: tensorboard's own EventAccumulator for the event files; for wandb's offline
`.wandb` file, a reader of its record log written here (LevelDB log framing, wandb's Record
protobuf), so nothing of wandb's writer is trusted. A missing package is simulated by hiding the
module (`sys.modules[name] = None`, what an uninstalled package looks like to `import`).
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_fixtures import cli_run

pytestmark = pytest.mark.timeout(300)

SETS = ("train.steps=4", "output.log_every=2", "output.checkpoint_every=2", "output.keep_checkpoints=0",
        "parallel.fsdp=none", "data.val_episodes=[2]", "train.eval_every=2", "train.eval_batches=1")


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _expected(rows: list[dict]) -> dict[str, dict[int, float]]:
    """tracker name -> {steps done: value} of every number in metrics.jsonl (the last row wins: a
    resumed run's retrained step), as trackers.py's docstring promises it."""
    section = {"step": "train", "interval": "perf", "eval": "val"}
    want: dict[str, dict[int, float]] = {}
    for row in rows:
        for k, v in row.items():
            if k not in ("kind", "step", "steps") and isinstance(v, (int, float)) and not isinstance(v, bool):
                want.setdefault(f"{section[row['kind']]}/{k}", {})[row["step"] + 1] = float(v)
    return want


def _tensorboard(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _mismatches(want: dict[str, dict[int, float]], got: dict[str, list[tuple[int, float]]]) -> list[str]:
    """What differs between metrics.jsonl's numbers and the tracker's points (each step once;
    TensorBoard stores float32)."""
    bad = [f"{tag}: not in the tracker" for tag in want if tag not in got]
    bad += [f"{tag}: not in metrics.jsonl" for tag in got if tag not in want]
    for tag in set(want) & set(got):
        steps = [s for s, _ in got[tag]]
        if sorted(steps) != sorted(want[tag]) or len(set(steps)) != len(steps):
            bad.append(f"{tag}: steps {steps} vs {sorted(want[tag])}")
        bad += [f"{tag} at {s}: {v} vs {want[tag].get(s)}" for s, v in got[tag]
                if s in want[tag] and np.float32(want[tag][s]) != np.float32(v)]
    return bad


@pytest.fixture(scope="module")
def tb_run(shards_rgb, tmp_path_factory):  # noqa: F811
    from trainkit.cli import main
    from trainkit_harness import TINY

    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("tracker") / "run"
    sets = ("output.progress=false", "data.num_workers=0", f"data.shards={shards_rgb}", f"output.dir={out}",
            "output.tracker=tensorboard", *SETS)
    assert main(["run", str(TINY), *[a for o in sets for a in ("--set", o)]]) == 0
    return out


def test_the_event_file_holds_the_numbers_of_metrics_jsonl(tb_run):
    rows = _rows(tb_run)
    want, got = _expected(rows), _tensorboard(tb_run / "tensorboard")
    assert _mismatches(want, got) == []
    # what the bar asks, spelled out: every loss, at steps done 1..4 (metrics.jsonl's 0..3)
    losses = [r["loss"] for r in rows if r["kind"] == "step"]
    assert [(s, np.float32(v)) for s, v in got["train/loss"]] == [(s + 1, np.float32(x)) for s, x in enumerate(losses)]
    assert {"train/grad_norm", "train/lr", "train/data_wait_s", "perf/samples_per_s_gpu", "perf/step_time_s",
            "perf/data_wait_frac", "val/val_loss"} <= set(got)
    assert "perf/mfu" not in got and "perf/peak_mem_gib" not in got  # null on a CPU: nothing to plot
    # positive control: one changed loss is found
    rows[0]["loss"] += 1e-3
    assert _mismatches(_expected(rows), got) == [f"train/loss at 1: {got['train/loss'][0][1]} vs {rows[0]['loss']}"]


def test_a_resumed_run_shows_each_step_once(tb_run, shards_rgb, tmp_path, capsys):  # noqa: F811
    """A crash after step 4 before its checkpoint: the resume from step-000002 retrains steps 3 and 4,
    and TensorBoard shows them once (SummaryWriter's purge_step), with the retrained values."""
    out = tmp_path / "run"
    shutil.copytree(tb_run, out)
    shutil.rmtree(out / "checkpoints" / "step-000004")
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", "output.tracker=tensorboard", *SETS)
    assert code == 0, err
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert _mismatches(_expected(_rows(out)), _tensorboard(out / "tensorboard")) == []


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_missing_package_is_one_line_naming_the_extra(tracker, shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, tracker, None)  # `import tracker` now raises ImportError
    out = tmp_path / "run"
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", f"output.tracker={tracker}", *SETS)
    assert code == 2 and err == (f"trainkit: output.tracker: '{tracker}' needs the {tracker} package, not installed "
                                 f"here: pip install '.[{tracker}]' (or pip install {tracker})"), err
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()  # refused before training


def test_an_unknown_tracker_is_refused_naming_the_choices(shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "output.tracker=mlflow")
    assert code == 2 and err == "trainkit: output.tracker: 'mlflow' is not one of none, tensorboard, wandb", err


# ---- wandb, offline ------------------------------------------------------------------------------

def _wandb_history(path: Path) -> list[dict[str, float]]:
    """The `history` records of a .wandb file: a 7-byte header, then LevelDB-log framed records
    (32 KiB blocks; per chunk crc32 (4 B), length (2 B), type (1 B): 1 full, 2 first, 3 middle,
    4 last), each a wandb Record protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, chunks, out = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunks += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(chunks)
            chunks = b""
            if rec.WhichOneof("record_type") == "history":
                out.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return out


@pytest.mark.slow  # wandb starts its wandb-core service: ~60 s on a loaded 2-core machine
def test_wandb_offline_logs_the_losses_without_a_network(shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)  # offline must be trainkit's default, not this machine's
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    out = tmp_path / "run"
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", "output.tracker=wandb", *SETS)
    assert code == 0, err
    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history = _wandb_history(run_file)
    got = {h["_step"]: h["train/loss"] for h in history if "train/loss" in h}
    assert got == {r["step"] + 1: r["loss"] for r in _rows(out) if r["kind"] == "step"}, (got, history)
    assert any("val/val_loss" in h for h in history)

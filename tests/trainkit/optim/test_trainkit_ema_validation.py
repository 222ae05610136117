"""The weight EMA (train.ema_decay) and the validation loss on held-out episodes (data.val_*).

Oracles:
- EMA: a reference average computed here in float64 from the initial weights (the tiny model built
  and initialised from the seed, as the trainer does) and every step's trained weights (read back
  from a checkpoint per step with DCP's own converter), against the EMA the trainer saved.
- Resume: an unbroken run. The run stopped at step 3 and resumed to 6 has the unbroken run's EMA
  (bit for bit) and validation records (trained and EMA weights).
- Holdout: the frame table read with pyarrow; no row the training stream took (sample log) lies
  in a held-out episode.
Runs use the tiny config's per-block FSDP in one process, so the EMA lives on DTensor shards.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch

from loader_fixtures import LENGTHS, shards_rgb  # noqa: F401 - session fixture
from trainkit.errors import ConfigError, DataError
from trainkit_fixtures import step_lines
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(180)

DECAY, STEPS, VAL_EPISODE = 0.8, 6, 2
SETS = (f"train.ema_decay={DECAY}", f"data.val_episodes=[{VAL_EPISODE}]", "train.eval_every=2", "train.eval_batches=2",
        "output.checkpoint_every=1", "output.keep_checkpoints=0", "output.log_every=1", "output.record_samples=true")


@pytest.fixture(scope="module")
def runs(shards_rgb, tmp_path_factory):  # noqa: F811
    """The unbroken run, and one stopped after step 3 and resumed to the end; their stdout too."""
    from trainkit.cli import main

    root = tmp_path_factory.mktemp("ema_val")
    dirs = {"unbroken": root / "unbroken", "resumed": root / "resumed"}
    outs = []
    for out, steps in ((dirs["unbroken"], STEPS), (dirs["resumed"], 3), (dirs["resumed"], STEPS)):
        sets = ("output.progress=false", "data.num_workers=0", f"data.shards={shards_rgb}", f"output.dir={out}",
                f"train.steps={steps}", *SETS)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["run", str(TINY), *[a for o in sets for a in ("--set", o)]])
        assert code == 0, stderr.getvalue()
        outs.append(stdout.getvalue())
    return dirs, outs


def _evals(out: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {x["step"]: x for x in lines if x["kind"] == "eval"}


def _checkpoint(out: Path, step: int, tmp: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dst = tmp / f"{out.name}-{step}.pt"
    dcp_to_torch_save(str(out / "checkpoints" / f"step-{step:06d}"), str(dst))
    return torch.load(dst, weights_only=False)


def test_ema_equals_a_reference_average_of_the_trained_weights(runs, tmp_path):
    from trainkit.models import build_model

    dirs, _ = runs
    model = build_model("pi05", "tiny")
    torch.manual_seed(0)  # train.seed of the tiny config: the trainer's initial weights
    model.init_weights()
    ref = {n: p.detach().double() for n, p in model.named_parameters()}
    for step in range(1, STEPS + 1):
        ck = _checkpoint(dirs["unbroken"], step, tmp_path)
        assert set(ck["ema"]) == set(ref)
        ref = {n: DECAY * r + (1 - DECAY) * ck["model"][n].double() for n, r in ref.items()}
        for n, r in ref.items():
            torch.testing.assert_close(ck["ema"][n].double(), r, rtol=1e-5, atol=1e-7, msg=f"{n} at step {step}")
    # the average moved away from the weights (a copy of the weights would pass the recurrence at decay 0)
    assert max((ck["ema"][n] - ck["model"][n]).abs().max().item() for n in ref) > 1e-4


def test_ema_and_validation_survive_resume(runs, tmp_path):
    dirs, _ = runs
    unbroken, resumed = _checkpoint(dirs["unbroken"], STEPS, tmp_path), _checkpoint(dirs["resumed"], STEPS, tmp_path)
    for n, e in unbroken["ema"].items():
        assert torch.equal(e, resumed["ema"][n]), n
    a, b = _evals(dirs["unbroken"]), _evals(dirs["resumed"])
    assert sorted(a) == [1, 3, 5] and sorted(b) == [1, 2, 3, 5]  # the stopped run also after its last step, 2
    for step in (1, 3, 5):
        assert {k: b[step][k] for k in ("val_loss", "val_loss_ema")} == {k: a[step][k] for k in ("val_loss", "val_loss_ema")}
    assert a[5]["val_loss"] != a[5]["val_loss_ema"] and a[5]["samples"] == 2 * 4
    # the training losses after the resume are the unbroken run's too
    assert [x["loss"] for x in step_lines(dirs["resumed"])[3:]] == [x["loss"] for x in step_lines(dirs["unbroken"])[3:]]


def test_validation_is_logged_to_metrics_summary_and_terminal(runs):
    dirs, outs = runs
    summary = json.loads((dirs["unbroken"] / "summary.json").read_text())
    assert summary["evals"] == list(_evals(dirs["unbroken"]).values())
    assert summary["val_loss"] == _evals(dirs["unbroken"])[5]["val_loss"]
    # the terminal counts steps done, as the checkpoint names do: metrics.jsonl's step 5 is the 6th
    assert any(f"eval 6/6 | val loss {summary['val_loss']:.4f}" in out for out in outs), outs
    assert re.search(rf"validation loss \(after step 6\) +{summary['val_loss']:.4f}, EMA weights", outs[0]), outs[0]


def test_training_never_samples_a_held_out_episode(runs, shards_rgb):  # noqa: F811
    from datakit.shards.index import load_frames

    dirs, _ = runs
    episode = load_frames(shards_rgb).column("episode_index").to_numpy()
    rows = [r for x in (dirs["unbroken"] / "samples-rank0.jsonl").read_text().splitlines() for r in json.loads(x)["rows"]]
    assert len(rows) == STEPS * 4
    assert VAL_EPISODE not in set(episode[rows].tolist())
    assert len(episode) == sum(LENGTHS)


def test_holdout_takes_whole_episodes_and_refuses_what_cannot_be(shards_rgb):  # noqa: F811
    from datakit.shards.index import load_index
    from trainkit.config import DataConfig
    from trainkit.validation import holdout

    index = load_index(shards_rgb)
    every = [e.episode_index for e in index.episodes]
    for fraction, n in ((0.25, 1), (0.5, 2), (0.75, 3)):
        split = holdout(DataConfig(shards=str(shards_rgb), val_fraction=fraction), index)
        assert len(split.val) == n and sorted(split.val + split.train) == every and not set(split.val) & set(split.train)
    assert holdout(DataConfig(shards=str(shards_rgb)), index).val == ()
    with pytest.raises(DataError, match=r"data.val_episodes names episodes \[9\]"):
        holdout(DataConfig(shards=str(shards_rgb), val_episodes=[1, 9]), index)
    with pytest.raises(DataError, match="takes all 4 episodes"):
        holdout(DataConfig(shards=str(shards_rgb), val_episodes=every), index)
    with pytest.raises(ConfigError, match="set data.val_episodes or data.val_fraction, not both"):
        DataConfig(shards=str(shards_rgb), val_episodes=[1], val_fraction=0.5)


def test_evaluation_without_a_holdout_is_refused(shards_rgb, tmp_path, capsys):  # noqa: F811
    from trainkit.cli import main

    code = main(["run", str(TINY), "--set", f"data.shards={shards_rgb}", "--set", f"output.dir={tmp_path}",
                 "--set", "train.eval_every=2"])
    assert code == 2
    assert capsys.readouterr().err.strip() == ("trainkit: train.eval_every: needs held-out episodes: set "
                                               "data.val_episodes or data.val_fraction")


def test_ema_skip_flag_leaves_the_average_or_equals_the_plain_update():
    """The deferred non-finite check's device flag: 1 keeps the average, 0 is the usual update."""
    from trainkit.optim.ema import WeightEMA

    model = torch.nn.Linear(3, 2)
    ema, plain = WeightEMA(model, 0.9), WeightEMA(model, 0.9)
    start = [s.clone() for s in ema.shadow]
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(skip=torch.ones(()))
    assert all(torch.equal(s, s0) for s, s0 in zip(ema.shadow, start))  # the initial weights still
    ema.update(skip=torch.zeros(()))
    plain.update()
    assert all(torch.allclose(a, b) for a, b in zip(ema.shadow, plain.shadow))

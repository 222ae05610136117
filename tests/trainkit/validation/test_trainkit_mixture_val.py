"""Validation on a weighted mixture (issue 27 follow-up): data.val_fraction holds out that fraction of
each source's episodes, a [[data.sources]] table's val_episodes names a source's own; the training
stream never samples them, and validation reports each source's loss (`val_loss/<name>`) and their
weight-weighted mean (`val_loss`).

Oracles: each source's frame table (index episodes' row ranges) for which episode a sample's row lies
in, with the unrestricted mixture as the positive control (it does sample the held-out episodes);
the model's own loss over the batches a source's validation reads, by hand; the weights (0.7, 0.3);
an unbroken run for the resumed one.
"""
import contextlib
import io
import json
import math

import pytest
import torch

from loader_fixtures import shards_b, shards_rgb  # noqa: F401 - session fixtures
from trainkit_harness import TINY, tiny_config

pytestmark = pytest.mark.timeout(240)

STEPS = 6
# shards_rgb has 4 episodes (0..3), shards_b 2 (0, 1): val_fraction 0.25 holds out one of each,
# positions floor((i + 1/2) E / n): episode 2 of shards_rgb, episode 1 of shards_b
HELD = {"sim": (2,), "out": (1,)}


def _sources(a, b, b_extra=""):
    return (f'data.sources=[{{shards = "{a}", weight = 0.7, name = "sim"}}, '
            f'{{shards = "{b}", weight = 0.3, slots = ["cam.hand", "", "cam.front"]{b_extra}}}]')


def _episode_of(index, rows):
    """Each frame-table row's episode_index, from the index's episode row ranges."""
    out = []
    for r in rows:
        ep = next(e for e in index.episodes if e.row_start <= r < e.row_start + e.length)
        out.append(ep.episode_index)
    return out


def _seen(data, shards, batches):
    """{source name: episodes its samples came from} over `batches` batches of a TrainData."""
    seen = {s.name: set() for s in shards.sources}
    stream = data.batches()
    for _ in range(batches):
        b = next(stream)
        for s, src in enumerate(shards.sources):
            rows = b.rows[b.sources == s].tolist()
            seen[src.name] |= set(_episode_of(shards.parts[s].index, rows))
    stream.close()
    return seen


@pytest.fixture(scope="module")
def opened(shards_rgb, shards_b, tmp_path_factory):  # noqa: F811
    """(config, opened mixture, the tiny model at its seed's initial weights), val_fraction 0.25."""
    from trainkit.config import loader_sources
    from trainkit.data import read_mixture_shards
    from trainkit.models import build_model

    cfg = tiny_config(shards_rgb, tmp_path_factory.mktemp("mixval") / "run", _sources(shards_rgb, shards_b),
                      "data.val_fraction=0.25", "train.eval_batches=2", "parallel.fsdp=none")
    model = build_model("pi05", "tiny")
    torch.manual_seed(0)
    model.init_weights()
    shards = read_mixture_shards(cfg.data, loader_sources(cfg.data), model.cfg.max_slots, fps=cfg.data.fps)
    yield cfg, shards, model
    shards.close()


def test_held_out_episodes_never_reach_the_training_stream(opened):
    from trainkit.data import TrainData
    from trainkit.models import family
    from trainkit.validation import plan_validation

    cfg, shards, model = opened
    fam, cpu = family("pi05"), torch.device("cpu")
    kw = dict(seed=0, rank=0, world_size=1, micro_batch=4, device=cpu, image_dtype=torch.float32, global_batch=4)
    train_shards, episodes, val = plan_validation(cfg, shards, fam, model.cfg, rank=0, world_size=1, device=cpu,
                                                  image_dtype=torch.float32)
    assert episodes is None and [s.episodes for s in train_shards.sources] == [(0, 1, 3), (0,)]
    assert set(val.parts) == {"sim", "out"}
    # 30 batches of 4: ~84 samples of sim's 3 training episodes, ~36 of out's one: every one is seen
    seen = _seen(TrainData(cfg.data, train_shards, fam, model.cfg, **kw), train_shards, 30)
    assert seen == {"sim": {0, 1, 3}, "out": {0}}
    # positive control: the same stream without the holdout samples the held-out episodes too
    everything = _seen(TrainData(cfg.data, shards, fam, model.cfg, **kw), shards, 30)
    assert everything == {"sim": {0, 1, 2, 3}, "out": {0, 1}}


def test_each_sources_validation_loss_is_the_models_loss_on_its_held_out_samples(opened):
    from trainkit.models import family
    from trainkit.validation import plan_validation

    cfg, shards, model = opened
    _, _, val = plan_validation(cfg, shards, family("pi05"), model.cfg, rank=0, world_size=1,
                                device=torch.device("cpu"), image_dtype=torch.float32)
    # each source's batches padded as the mixture's training batches are (shards_b: 4 state, 3 action
    # channels, the mixture 6 and 6): Pi0.5's prompt has a token per state channel
    assert {name: (p.data.loader.dataset.state_dim, p.data.loader.dataset.action_dim)
            for name, p in val.parts.items()} == {"sim": (6, 6), "out": (6, 6)}
    got = val.losses(model, contextlib.nullcontext())
    model.eval()
    indexes = {src.name: p.index for src, p in zip(shards.sources, shards.parts)}
    for name, part in val.parts.items():  # by hand: the batches its validation reads, each in a held-out episode
        part.data.load_state_dict(part.start)
        stream = part.data.batches()
        losses = []
        with torch.no_grad():
            for _ in range(cfg.train.eval_batches):
                b = next(stream)
                assert set(_episode_of(indexes[name], b.rows.tolist())) == set(HELD[name])
                losses.append(float(model(b.model)))
        stream.close()
        assert got[f"val_loss/{name}"] == pytest.approx(sum(losses) / len(losses), rel=1e-6)
    assert got["val_loss"] == pytest.approx(0.7 * got["val_loss/sim"] + 0.3 * got["val_loss/out"], rel=1e-9)
    assert got["val_loss/sim"] != got["val_loss/out"]  # two datasets: two losses, not one copied
    assert val.samples == 2 * 2 * 4  # two sources x eval_batches x micro_batch


def _run(shards_rgb, shards_b, out, steps, *extra):  # noqa: F811
    from trainkit.cli import main

    sets = ("output.progress=false", "data.num_workers=0", f"data.shards={shards_rgb}", f"output.dir={out}",
            _sources(shards_rgb, shards_b), f"train.steps={steps}", "train.eval_every=3", "train.eval_batches=1",
            "parallel.fsdp=none", "parallel.ac_stride={}", "output.log_every=1", "optim.schedule=constant", *extra)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["run", str(TINY), *[a for o in sets for a in ("--set", o)]])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def runs(shards_rgb, shards_b, tmp_path_factory):  # noqa: F811
    """An unbroken mixture run with validation, and one stopped after step 3 (a checkpoint) and resumed."""
    root = tmp_path_factory.mktemp("mixval_runs")
    outs = {}
    for name, steps in (("unbroken", STEPS), ("resumed", 3), ("resumed", STEPS)):
        code, stdout, stderr = _run(shards_rgb, shards_b, root / name, steps, "data.val_fraction=0.25")
        assert code == 0, stderr
        outs[name] = stdout
    return root, outs


def _evals(out):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]


def test_a_mixture_run_logs_each_sources_validation_loss(runs):
    from trainkit.observe.summary import format_summary

    root, outs = runs
    evals = _evals(root / "unbroken")
    assert [e["step"] for e in evals] == [2, 5]
    for e in evals:
        sim, out = e["val_loss/sim"], e["val_loss/out"]
        assert math.isfinite(sim) and math.isfinite(out) and sim != out
        assert e["val_loss"] == pytest.approx(0.7 * sim + 0.3 * out, rel=1e-9)
        assert e["samples"] == 2 * 1 * 4
    summary = json.loads((root / "unbroken" / "summary.json").read_text())
    assert summary["evals"][-1] == evals[-1] and summary["val_loss"] == evals[-1]["val_loss"]
    table = format_summary(summary)
    for name in ("sim", "out"):  # under the validation loss's row, each source's
        assert [name, f"{evals[-1][f'val_loss/{name}']:.4f}"] in [line.split() for line in table.splitlines()]
    assert "val loss/sim" in outs["unbroken"]  # the terminal's eval line


def test_a_resumed_mixture_run_validates_as_the_unbroken_one(runs):
    root, _ = runs
    unbroken, resumed = _evals(root / "unbroken"), _evals(root / "resumed")
    assert resumed == unbroken  # the step-3 record from the first leg, the step-6 one after the resume


@pytest.mark.parametrize("extra, key", [
    ("data.val_episodes=[1]", "data.val_episodes: a mixture names its validation episodes per source"),
    (("data.val_fraction=0.25", ", val_episodes = [1]"), "data.val_fraction: set data.val_fraction"),
    ((None, ", val_episodes = [-1]"), "data.sources[1]: val_episodes are episode_index numbers >= 0, got -1"),
    ((None, ', val_episodes = ["1"]'), "data.sources[1].val_episodes[0]: expected int"),
    ((None, ", val_episodes = [0, 1]"), "the holdout takes all 2 episodes"),
    ((None, ", val_episodes = [7]"), "the source's val_episodes (out) names episodes [7], which the index lacks"),
])
def test_a_bad_mixture_val_spec_is_one_line(shards_rgb, shards_b, tmp_path, extra, key):  # noqa: F811
    from trainkit.cli import main

    setting, b_extra = extra if isinstance(extra, tuple) else (extra, "")
    sets = ("output.progress=false", "data.num_workers=0", f"data.shards={shards_rgb}", f"output.dir={tmp_path}",
            "parallel.fsdp=none", "train.steps=1", _sources(shards_rgb, shards_b, b_extra),
            *([setting] if setting else []))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(TINY), *[a for o in sets for a in ("--set", o)]]) == 2
    err = stderr.getvalue()
    assert key in err and err.count("\n") == 1, err


def test_a_source_without_val_episodes_trains_on_all_of_its_own(opened, shards_rgb, shards_b):  # noqa: F811
    """Only the sources naming val_episodes are validated; the weights renormalise over them."""
    from trainkit.config import load_config
    from trainkit.validation import source_holdouts

    _, shards, _ = opened
    cfg = load_config(TINY, [_sources(shards_rgb, shards_b, ", val_episodes = [0]"), "output.dir=/o"])
    assert cfg.data.holds_out
    splits = source_holdouts(cfg.data, shards)
    assert [(s.train, s.val) for s in splits] == [(None, ()), ((1,), (0,))]


def test_a_mixture_checkpoint_from_before_source_val_episodes_resumes(tmp_path):
    """A [[data.sources]] key its trainkit lacked (val_episodes) had its default then: not a change;
    a changed one is refused (it decides the training samples)."""
    from trainkit.checkpoint.resume_rules import RunRecord, recorded_config, resume_changes
    from trainkit.config import load_config
    from trainkit.errors import CheckpointError

    def config(b=""):
        sources = f'data.sources=[{{shards = "a/", weight = 0.7}}, {{shards = "b/", weight = 0.3{b}}}]'
        return recorded_config(load_config("pi05_tiny", [sources, "output.dir=/o"]).to_dict())

    now = config()
    before = {**now, "data": {**now["data"], "sources": [{k: v for k, v in s.items() if k != "val_episodes"}
                                                         for s in now["data"]["sources"]]}}
    record = lambda c: RunRecord(config=c, dataset={"sources": [{"x": 1}, {"x": 2}]}, global_batch=4)  # noqa: E731
    assert resume_changes(tmp_path, record(before), 1, record(now), 1) == []
    with pytest.raises(CheckpointError, match=r"written with data.sources\[1\].val_episodes=\[\]"):
        resume_changes(tmp_path, record(now), 1, record(config(", val_episodes = [1]")), 1)


def test_predict_on_a_source_takes_its_held_out_episodes(runs, shards_rgb, shards_b, tmp_path, capsys):  # noqa: F811
    """`trainkit predict` on one of a mixture run's datasets defaults to that source's validation episodes."""
    from trainkit.cli import main

    root, _ = runs
    for name, folder in (("sim", shards_rgb), ("out", shards_b)):
        assert main(["predict", str(root / "unbroken"), "--shards", str(folder), "--out", str(tmp_path / name),
                     "--device", "cpu", "--steps", "2"]) == 0, capsys.readouterr().err
        body = json.loads((tmp_path / name / "predict.json").read_text())
        assert body["episodes_from"] == "the run's validation episodes (data.val_*)" and body["trained_on"] == []
        assert [e["episode_index"] for e in body["episodes"]] == list(HELD[name])


def test_a_mixture_sources_episodes_are_sorted_and_never_empty():
    from datakit.loader import MixtureSource

    assert MixtureSource(root="a/", weight=1, episodes=[3, 1, 3]).episodes == (1, 3)
    assert MixtureSource(root="a/", weight=1).episodes is None
    with pytest.raises(ValueError, match="mixture source a/: episodes is empty"):
        MixtureSource(root="a/", weight=1, episodes=[])

"""trainkit run on a weighted mixture of two generated datasets that differ in camera names (each
source maps its own cameras to the model's slots) and in state/action sizes (6/6 and 4/3): the
tiny pi05 preset trains with falling loss and logs the loss per source (issue 27).

Oracles: the step loss itself (with one metric line per step, the per-source means weighted by
their sample counts are the step's mean loss, pi05's samples being of one size), the global batch
(the counts add up to it) and the run's own summary.json (the table's per-source rows).
"""
import json
import math
import re
import shutil

import pytest
import torch

# session fixtures; shards_b: other cameras, 4 state / 3 action channels
from loader_fixtures import shards_b, shards_rgb  # noqa: F401
from trainkit_harness import tiny_config

# 16: the loss falls well below 80% of its start at every seed tried (0.70-0.75); at 12 steps the 8-head
# tiny preset (issue 35) ends at 0.81 with this seed, the 4-head one at 0.80: the bound was a seed's edge
STEPS = 16
# interval figures that are wall-clock measurements, not functions of the samples
TIMING = ("step_time_s", "samples_per_s_gpu", "tokens_per_s_gpu", "model_flops_per_s_gpu", "data_wait_s",
          "data_wait_frac")


@pytest.fixture(scope="module")
def mixture_run(shards_rgb, shards_b, tmp_path_factory):  # noqa: F811
    from trainkit.train import run

    out = tmp_path_factory.mktemp("mixture") / "run"
    sources = (f'[{{shards = "{shards_rgb}", weight = 0.7, name = "sim"}}, '
               f'{{shards = "{shards_b}", weight = 0.3, slots = ["cam.hand", "", "cam.front"]}}]')
    sets = (f"data.sources={sources}", "output.log_every=1", "parallel.fsdp=none", "parallel.ac_stride={}",
            "optim.schedule=constant")
    result = run(tiny_config(shards_rgb, out, *sets, f"train.steps={STEPS}"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resumed = out.with_name("resumed")  # stopped at half-way with a checkpoint, then resumed to the end
    run(tiny_config(shards_rgb, resumed, *sets, f"train.steps={STEPS // 2}"))
    second = run(tiny_config(shards_rgb, resumed, *sets, f"train.steps={STEPS}"))
    return result, rows, out, second


def test_a_mixture_trains_with_falling_loss(mixture_run):
    result, *_ = mixture_run
    losses = [result.losses[s] for s in range(STEPS)]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses


def test_a_resumed_mixture_run_gives_the_unbroken_runs_losses_per_source(mixture_run):
    unbroken, _, _, second = mixture_run
    assert second.start_step == STEPS // 2
    assert second.losses == {s: unbroken.losses[s] for s in range(STEPS // 2, STEPS)}
    assert second.history == [{**h, **{k: second.history[i][k] for k in TIMING}} for i, h in
                              enumerate(unbroken.history[STEPS // 2:])]


def test_each_log_step_holds_the_loss_of_each_source(mixture_run):
    result, rows, *_ = mixture_run
    steps = {r["step"]: r for r in rows if r["kind"] == "step"}
    intervals = [r for r in rows if r["kind"] == "interval"]
    assert [r["step"] for r in intervals] == list(range(STEPS))
    shares = {"sim": 0, "out": 0}  # shards_b's folder is named out: its default name
    for r in intervals:
        counts = {name: r[f"samples/{name}"] for name in shares}
        assert sum(counts.values()) == 4  # the global batch
        mean = sum(r[f"loss/{name}"] * n for name, n in counts.items() if n) / 4
        assert mean == pytest.approx(steps[r["step"]]["loss"], rel=1e-5)
        shares = {name: shares[name] + n for name, n in counts.items()}
    assert all(abs(shares[name] - w * 4 * STEPS) <= 1 for name, w in (("sim", 0.7), ("out", 0.3))), shares
    by_source = result.summary["source_loss"]
    assert set(by_source) == {"sim", "out"}
    for name, loss in by_source.items():
        first = next(r[f"loss/{name}"] for r in intervals if f"loss/{name}" in r)
        last = next(r[f"loss/{name}"] for r in reversed(intervals) if f"loss/{name}" in r)
        assert loss == {"first": first, "last": last}
        assert last < first  # each source learns


def test_the_summary_table_shows_the_loss_per_source(mixture_run, capsys):
    from trainkit.observe.summary import format_summary

    _, _, out, _ = mixture_run
    table = format_summary(json.loads((out / "summary.json").read_text()))
    assert [line.split()[0] for line in table.splitlines() if line.startswith("  ") and "->" in line] == ["sim", "out"]


def test_inspect_plans_the_mixtures_storage_per_source(shards_rgb, shards_b, capsys):  # noqa: F811
    """The mixture's figures follow from its sources' by the rules stated (plan/mixture.py): bytes
    per sample share-weighted, working sets added; each source's own bytes are `datakit plan`'s of it alone."""
    from datakit.cli import main as datakit_main
    from trainkit.cli import main

    sources = (f'data.sources=[{{shards = "{shards_rgb}", weight = 3, name = "a"}}, '
               f'{{shards = "{shards_b}", weight = 1, name = "b"}}]')
    sets = [a for o in (sources, "output.dir=/tmp/unused") for a in ("--set", o)]
    assert main(["inspect", "pi05_tiny", *sets, "--samples-per-s", "100", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["loader"]["mixture"]
    a, b = m["sources"]
    assert (a["weight"], b["weight"]) == (0.75, 0.25) and a["bytes_per_sample"] != b["bytes_per_sample"]
    assert m["bytes_per_sample"] == pytest.approx(0.75 * a["bytes_per_sample"] + 0.25 * b["bytes_per_sample"])
    assert m["working_set_bytes_per_node"] == a["working_set_bytes_per_node"] + b["working_set_bytes_per_node"]
    assert m["measure"] is None  # the sources map different cameras: no one `datakit plan --measure` line
    # each source alone through `datakit plan` with the run's loader config (b: its own cameras as slots)
    toml = shards_b.parent / "loader.toml"
    assert main(["inspect", "pi05_tiny", *sets, "--loader-toml", str(toml)]) == 0
    capsys.readouterr()
    text = toml.read_text()
    for src, folder, cams in ((a, shards_rgb, None), (b, shards_b, '["cam.front", "cam.hand"]')):
        if cams:
            text = re.sub(r"(?m)^slots = .*$", f"slots = {cams}", text)
        toml.write_text(text)
        assert datakit_main(["plan", str(folder), "--loader-config", str(toml), "--samples-per-s", "1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["plan"]["bytes_per_sample"] == src["bytes_per_sample"]
    assert main(["inspect", "pi05_tiny", *sets, "--samples-per-s", "100"]) == 0
    text = capsys.readouterr().out
    assert "mixture: " in text and "source b (25.0%)" in text and "ceiling" in text


def test_a_resume_refuses_changed_weights_and_takes_a_moved_source(tmp_path):
    """resume_rules: a mixture's weights, slots, prompt and fps decide its samples; a source's path does not."""
    from trainkit.checkpoint.resume_rules import RunRecord, recorded_config, resume_changes
    from trainkit.config import load_config
    from trainkit.errors import CheckpointError

    def record(*sets):
        cfg = load_config("pi05_tiny", ['data.sources=[{shards = "a/", weight = 0.7}, {shards = "b/", weight = 0.3}]',
                                        "output.dir=/o", *sets])
        return RunRecord(config=recorded_config(cfg.to_dict()), dataset={"sources": [{"x": 1}, {"x": 2}]},
                         global_batch=4)

    saved = record()
    assert resume_changes(tmp_path, saved, 1, record(), 1) == []
    moved = record('data.sources=[{shards = "c/a/", weight = 0.7, name = "a"}, {shards = "b/", weight = 0.3}]')
    assert resume_changes(tmp_path, saved, 1, moved, 1) == []
    for change, key in (('data.sources=[{shards = "a/", weight = 0.5}, {shards = "b/", weight = 0.5}]',
                         "data.sources[0].weight"),
                        ('data.sources=[{shards = "a/", weight = 0.7, prompt = "go"}, {shards = "b/", weight = 0.3}]',
                         "data.sources[0].prompt"),
                        ("data.fps=5", "data.fps")):
        with pytest.raises(CheckpointError, match=rf"written with {re.escape(key)}="):
            resume_changes(tmp_path, saved, 1, record(change), 1)


def test_predict_on_each_source_of_a_mixture_run_with_its_own_slots(mixture_run, shards_rgb, shards_b, tmp_path,  # noqa: F811
                                                                    capsys):
    """Each source's dataset predicts with the source's own slots (shards_b's cameras are not the run's
    data.slots) and statistics; a dataset that is none of the sources is refused in one line."""
    from trainkit.cli import main

    _, _, out, _ = mixture_run
    for name, folder in (("sim", shards_rgb), ("out", shards_b)):
        assert main(["predict", str(out), "--shards", str(folder), "--out", str(tmp_path / name), "--device", "cpu",
                     "--episodes", "0", "--steps", "2"]) == 0, capsys.readouterr().err
        body = json.loads((tmp_path / name / "predict.json").read_text())
        assert body["stats_from"] == f"{folder} (the run's dataset)" and body["trained_on"] == [0]
    other = tmp_path / "other"
    shutil.copytree(shards_b, other)
    sums = json.loads((other / "checksums.json").read_text())
    key = next(iter(sums["sha256"]))
    sums["sha256"][key] = "0" * 64  # another dataset, by its identity
    (other / "checksums.json").write_text(json.dumps(sums))
    capsys.readouterr()
    assert main(["predict", str(out), "--shards", str(other), "--out", str(tmp_path / "x"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainkit: {other}: none of the datasets of the run's mixture") and err.count("\n") == 1


def test_a_checkpoint_from_before_mixtures_resumes(tmp_path):
    """A key its trainkit lacked (data.fps, data.sources) had its default then: not a change."""
    from trainkit.checkpoint.resume_rules import RunRecord, recorded_config, resume_changes
    from trainkit.config import load_config

    now = recorded_config(load_config("pi05_tiny", ["output.dir=/o"]).to_dict())
    before = {**now, "data": {k: v for k, v in now["data"].items() if k not in ("fps", "sources")}}
    record = lambda config: RunRecord(config=config, dataset={"sha256": {}}, global_batch=4)  # noqa: E731
    assert resume_changes(tmp_path, record(before), 1, record(now), 1) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_give_the_eager_losses_per_source(shards_rgb, tmp_path):  # noqa: F811
    """The graphed micro-step returns its per-item losses from the graph's static output (cudagraphs.py):
    each source's loss equals the eager run's. Two sources of one folder (the prebuilt fixture of the GPU
    machine, DATAKIT_LOADER_FIXTURES, has no video decoder to build another), told apart by name and prompt."""
    import torch.distributed as dist

    from test_gr00t import OPTIMISED, config
    from trainkit.train import run

    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    sources = (f'data.sources=[{{shards = "{shards_rgb}", weight = 0.7, name = "a"}}, '
               f'{{shards = "{shards_rgb}", weight = 0.3, name = "b", prompt = "stack the blocks"}}]')
    sets = (*OPTIMISED, sources, "parallel.param_dtype=float32", "optim.fused=false", "train.steps=8",
            "output.log_every=2")
    eager = run(config(shards_rgb, tmp_path / "eager", *sets)).history
    graphed = run(config(shards_rgb, tmp_path / "graphed", *sets, "parallel.cuda_graphs=true"))
    assert "cuda_graphs" in graphed.plan.applied
    for e, g in zip(eager, graphed.history, strict=True):
        for name in ("a", "b"):
            assert e[f"samples/{name}"] == g[f"samples/{name}"]
            if e[f"samples/{name}"]:
                assert abs(e[f"loss/{name}"] - g[f"loss/{name}"]) < 1e-4, (e, g)

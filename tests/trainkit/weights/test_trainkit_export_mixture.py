"""`trainkit export --source NAME` of a run on a weighted mixture (issue 27 follow-up): the export
is for that one robot.

A tiny pi05 run on the two generated sources of tests/trainkit/data/test_trainkit_mixture.py (shards_rgb, named
"sim"; shards_b, default name "out", its own slots and a prompt) is exported once per source. Oracles:
each source's own shard index (its cameras as its slots map them, its state/action widths, its
statistics, compared as numpy arrays with the file LeRobot's normaliser step loads and with openpi's
norm_stats.json) and the loader's own per-source normalisation (`Normaliser.from_sources`: the
exported statistics give that source's row of its tables). Positive control: the two sources'
exports differ, and each one's statistics are not the other source's. Refusals (no --source on a
mixture, an unknown name, --source on one folder): one line, exit 2, nothing written.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import shards_b, shards_rgb  # noqa: F401 - session fixtures
from trainkit_harness import tiny_config

PROMPT = "stack the blocks, gently"
SLOTS_B = ["cam.hand", "", "cam.front"]  # shards_b's cameras into the model's slots 0 and 2

pytestmark = pytest.mark.timeout(300)


def _train(out: Path, shards: Path, *sets: str) -> Path:
    from trainkit.train import run

    run(tiny_config(shards, out, "train.steps=2", "output.checkpoint_every=2", "parallel.fsdp=none",
                    "parallel.ac_stride={}", *sets))
    return out


@pytest.fixture(scope="module")
def mixture_run(shards_rgb, shards_b, tmp_path_factory):  # noqa: F811
    sources = (f'data.sources=[{{shards = "{shards_rgb}", weight = 0.7, name = "sim"}}, '
               f'{{shards = "{shards_b}", weight = 0.3, slots = {json.dumps(SLOTS_B)}, prompt = "{PROMPT}"}}]')
    return _train(tmp_path_factory.mktemp("mixexport") / "run", shards_rgb, sources)


def export(run: Path, out: Path, *extra: str, fmt: str = "lerobot") -> int:
    from trainkit.cli import main

    return main(["export", str(run), str(out), "--format", fmt, *extra])


def lerobot_stats(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """The statistics LeRobot's normaliser step of the export loads (its state file), by part."""
    from safetensors.numpy import load_file

    pipe = json.loads((folder / "policy_preprocessor.json").read_text())
    step = next(s for s in pipe["steps"] if s["registry_name"] == "normalizer_processor")
    tensors = load_file(str(folder / step["state_file"]))
    out: dict[str, dict[str, np.ndarray]] = {"state": {}, "action": {}}
    for key, value in tensors.items():
        feature, stat = key.rsplit(".", 1)
        out["state" if feature == "observation.state" else "action"][stat] = value
    return out


def own_stats(shards: Path) -> dict[str, dict[str, np.ndarray]]:
    from datakit.shards.index import load_index

    index = load_index(shards)
    return {part: {k: np.asarray(v, np.float32) for k, v in index.stats[part].items()} for part in ("state", "action")}


@pytest.fixture(scope="module")
def exports(mixture_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixexports")
    for name in ("sim", "out"):
        assert export(mixture_run, root / name, "--source", name) == 0
    assert export(mixture_run, root / "out_openpi", "--source", "out", fmt="openpi") == 0
    return root


def test_each_sources_export_has_its_cameras_sizes_and_statistics(exports, shards_rgb, shards_b):  # noqa: F811
    from datakit.shards.index import load_index

    for name, shards, cams in (("sim", shards_rgb, None), ("out", shards_b, [c for c in SLOTS_B if c])):
        index = load_index(shards)
        config = json.loads((exports / name / "config.json").read_text())
        visual = [k for k, v in config["input_features"].items() if v["type"] == "VISUAL"]
        assert visual == (cams or list(index.cameras))  # sim: no slots of its own, data.slots = []: its cameras
        assert config["input_features"]["observation.state"]["shape"] == [len(index.state_names)]
        assert config["output_features"]["action"]["shape"] == [len(index.action_names)]
        theirs, ours = lerobot_stats(exports / name), own_stats(shards)
        for part in ("state", "action"):
            assert set(theirs[part]) == set(ours[part])
            for stat, values in ours[part].items():
                np.testing.assert_array_equal(theirs[part][stat], values, err_msg=f"{name} {part}.{stat}")
    # the sources differ in every respect checked above (the positive control of those checks)
    a, b = (json.loads((exports / n / "config.json").read_text()) for n in ("sim", "out"))
    assert a["input_features"] != b["input_features"] and a["output_features"] != b["output_features"]
    assert own_stats(shards_rgb)["state"]["q01"].shape != lerobot_stats(exports / "out")["state"]["q01"].shape


def test_the_statistics_are_the_ones_the_loader_normalised_each_source_with(exports, shards_rgb,  # noqa: F811
                                                                           shards_b):  # noqa: F811
    """Normaliser.from_sources (the mixture's loader) builds its per-source rows from what each
    export carries; the other source's export gives another row (the check can fail)."""
    import torch

    from datakit.loader import LoaderConfig, Normaliser
    from datakit.loader.normalise import affine_from_stats
    from datakit.shards.index import load_index

    cfg = LoaderConfig(norm="quantile")  # pi05_tiny's data.norm
    norm = Normaliser.from_sources([load_index(shards_rgb), load_index(shards_b)], cfg, state_dim=6, action_dim=6)
    rows = {}
    for s, name in enumerate(("sim", "out")):
        stats = lerobot_stats(exports / name)
        for part, (scale, bias) in (("state", norm.state_affine), ("action", norm.action_affine)):
            a, c = affine_from_stats({k: v.tolist() for k, v in stats[part].items()}, "quantile")
            # the export holds the statistics as float32 (LeRobot's): equal to that rounding
            assert torch.allclose(scale[s, : a.numel()], a, rtol=1e-6, atol=1e-6)
            assert torch.allclose(bias[s, : c.numel()], c, rtol=1e-6, atol=1e-6)
            assert not scale[s, a.numel():].any()  # the padding the export's width leaves out
            rows[(name, part)] = a
    for part in ("state", "action"):  # the other source's export does not give this row
        other = rows[("out", part)]
        assert not torch.allclose(norm.state_affine[0][0, : other.numel()] if part == "state"
                                  else norm.action_affine[0][0, : other.numel()], other, rtol=1e-3, atol=1e-3)


def test_openpi_gets_the_sources_norm_stats_and_the_readme_its_prompt(exports, shards_b):  # noqa: F811
    body = json.loads((exports / "out_openpi" / "assets" / "trainkit" / "norm_stats.json").read_text())["norm_stats"]
    ours = own_stats(shards_b)
    for part, key in (("state", "state"), ("action", "actions")):
        for stat in ("mean", "std", "q01", "q99"):
            np.testing.assert_array_equal(np.asarray(body[key][stat], np.float32), ours[part][stat])
    for name in ("out", "out_openpi"):
        assert PROMPT in (exports / name / "README.txt").read_text()
        marker = json.loads((exports / name / "trainkit_export.json").read_text())
        assert (marker["source"], marker["prompt"]) == ("out", PROMPT)
    assert PROMPT not in (exports / "sim" / "README.txt").read_text()
    assert json.loads((exports / "sim" / "trainkit_export.json").read_text())["prompt"] == ""


def test_a_mixture_export_needs_a_known_source_and_one_folder_none(mixture_run, shards_rgb, tmp_path,  # noqa: F811
                                                                 capsys, monkeypatch):
    """Refused from the checkpoint's config, before any weight is read (a read here would fail)."""
    import trainkit.weights.export as export_module

    def no_read(*_):
        raise AssertionError("the weights were read")

    capsys.readouterr()
    monkeypatch.setattr(export_module, "_read", no_read)
    assert export(mixture_run, tmp_path / "a") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--source NAME" in err and "(NAME: sim, out)" in err, err
    assert export(mixture_run, tmp_path / "b", "--source", "droid") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--source 'droid'" in err and "(its sources: sim, out)" in err, err
    one = _train(tmp_path / "one", shards_rgb)
    capsys.readouterr()
    assert export(one, tmp_path / "c", "--source", "sim") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a mixture" in err, err
    assert not any((tmp_path / n).exists() for n in "abc")
    monkeypatch.undo()
    assert export(one, tmp_path / "c") == 0  # the control: the same run exports without --source


def test_export_help_names_the_flag(capsys):
    from trainkit.cli import main

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "--source NAME" in capsys.readouterr().out

"""`model.init_from` without the LeRobot oracle (issue 17): refusals, FSDP2 shards, resume.

The checkpoints here are trainkit's own exports of a tiny model with every parameter random; the
oracle of a load is the file itself (safetensors' reader): after `init_from` under 2-rank FSDP2,
every tensor of the run's checkpoint equals the file's, mapped. (That the mapping is LeRobot's is
tests/trainkit/models/pi05/test_pi05_lerobot_parity.py's job.)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainkit.errors import CheckpointError
from trainkit.models import build_model, family
from trainkit.models.pi05 import weights as pi05_weights
from trainkit.weights.load import load_weights, write_weights
from trainkit_fixtures import cli_run, shards_rgb, step_lines  # noqa: F401 - fixtures
from trainkit_harness import run_distributed, tiny_config

pytestmark = pytest.mark.timeout(120)
FAM = family("pi05")


def random_tiny() -> torch.nn.Module:
    torch.manual_seed(3)
    model = build_model("pi05", "tiny")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.1))
    return model


def export(model: torch.nn.Module, folder: Path, fmt: str = "lerobot", edit=None) -> Path:
    tensors = {k: v.clone() for k, v in FAM.weights.export_tensors(model.cfg, model.state_dict(), fmt).items()}
    if edit:
        edit(tensors)
    write_weights(folder, tensors, FAM.weights.config_json(model.cfg, {"cameras": ["a"], "state_dim": 6,
                                                                          "action_dim": 6}))
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    model = random_tiny()
    return model, export(model, tmp_path_factory.mktemp("init") / "ckpt")


def test_both_layouts_load_every_parameter_exactly(source, tmp_path):
    model, _ = source
    for fmt in pi05_weights.FORMATS:
        said: list[str] = []
        got = build_model("pi05", "tiny")
        info = load_weights(got, FAM, export(model, tmp_path / fmt, fmt), said.append)
        assert info["layout"] == fmt and f"{fmt} format" in said[0]
        for (name, want), p in zip(model.named_parameters(), got.parameters()):
            assert torch.allclose(p, want, rtol=0, atol=1e-6), (fmt, name)


LM_Q = "model." + pi05_weights.L + "layers.0.self_attn.q_proj.weight"
GATE = "model." + pi05_weights.E + "layers.1.input_layernorm.dense.bias"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop(LM_Q), f"missing key '{LM_Q}'"),
    (lambda t: t.__setitem__(GATE, t[GATE][:-1]), "shape mismatch for lm_layers.1.expert.ada.bias"),
    (lambda t: [t.__setitem__("net." + k.removeprefix("model."), t.pop(k)) for k in list(t)],
     "unknown checkpoint format"),
], ids=["missing_key", "shape", "unknown_layout"])
def test_a_bad_checkpoint_is_refused_in_one_line_before_training(source, tmp_path, shards_rgb, capsys,  # noqa: F811
                                                                 edit, message):
    folder = export(source[0], tmp_path / "bad", edit=edit)
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}",
                        f"model.init_from={folder}", "train.steps=2")
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert str(folder / "model.safetensors") in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused at launch: no step ran


def test_a_folder_without_config_json_is_refused(source, tmp_path):
    folder = export(source[0], tmp_path / "ckpt")
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json.*missing"):
        load_weights(build_model("pi05", "tiny"), FAM, folder, print)


def test_fsdp2_ranks_each_load_their_shard(source, shards_rgb, tmp_path):  # noqa: F811
    """2 gloo ranks, per-block FSDP2 (every parameter sharded): after one step at lr 1e-12 the
    checkpoint (DCP, gathered by the export reader) holds the file's tensors."""
    from trainkit.weights.export import load_run_model

    model, folder = source
    run = tmp_path / "fsdp"
    [r] = run_distributed([tiny_config(shards_rgb, run, f"model.init_from={folder}", "train.steps=1", "optim.lr=1e-12",
                                       "optim.warmup_steps=0", "output.checkpoint_every=1", "parallel.fsdp=block")])
    assert "error" not in r, r
    loaded, _, _ = load_run_model(run)
    for (name, want), p in zip(model.named_parameters(), loaded.parameters()):
        assert torch.allclose(p, want, rtol=0, atol=1e-5), name


def test_a_resume_reloads_its_own_checkpoint_not_init_from(source, shards_rgb, tmp_path, capsys):  # noqa: F811
    model, folder = source
    common = (f"data.shards={shards_rgb}", f"model.init_from={folder}", "output.checkpoint_every=2",
              "parallel.fsdp=none", "parallel.ac_stride={}")
    code, err = cli_run(capsys, *common, f"output.dir={tmp_path / 'unbroken'}", "train.steps=4")
    assert code == 0, err
    code, err = cli_run(capsys, *common, f"output.dir={tmp_path / 'broken'}", "train.steps=2")
    assert code == 0 and "model.init_from" in err, err
    (folder / "model.safetensors").rename(folder / "moved")  # a resume must not need it
    try:
        code, err = cli_run(capsys, *common, f"output.dir={tmp_path / 'broken'}", "train.steps=4")
    finally:
        (folder / "moved").rename(folder / "model.safetensors")
    assert code == 0 and "model.init_from" not in err, err
    unbroken = {x["step"]: x["loss"] for x in step_lines(tmp_path / "unbroken")}
    resumed = {x["step"]: x["loss"] for x in step_lines(tmp_path / "broken")}
    assert resumed == unbroken and sorted(resumed) == [0, 1, 2, 3]


def _openpi_stats(folder: Path, stats: dict) -> None:
    path = folder / "assets" / "robot" / "norm_stats.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"norm_stats": {"state": stats["state"], "actions": stats["action"]}}))


def test_norm_from_checkpoint_uses_the_checkpoints_statistics(source, shards_rgb, tmp_path, capsys):  # noqa: F811
    from datakit.shards.index import load_index

    model, _ = source
    index = load_index(shards_rgb)
    common = (f"data.shards={shards_rgb}", "train.steps=2", "parallel.fsdp=none", "parallel.ac_stride={}")
    runs = {}
    for name, shift in (("same", 0.0), ("shifted", 0.5)):
        folder = export(model, tmp_path / name)
        _openpi_stats(folder, {p: {k: [x + shift for x in index.stats[p][k]] for k in ("q01", "q99")}
                               for p in ("state", "action")})
        code, err = cli_run(capsys, *common, f"model.init_from={folder}", "data.norm_from=checkpoint",
                            f"output.dir={tmp_path / ('run_' + name)}")
        assert code == 0 and f"normalisation statistics from {folder / 'assets/robot/norm_stats.json'}" in err, err
        runs[name] = [x["loss"] for x in step_lines(tmp_path / f"run_{name}")]
    code, err = cli_run(capsys, *common, f"model.init_from={tmp_path / 'same'}", f"output.dir={tmp_path / 'dataset'}")
    assert code == 0, err
    assert runs["same"] == [x["loss"] for x in step_lines(tmp_path / "dataset")]  # the index's own numbers
    assert runs["shifted"] != runs["same"]


def test_norm_from_checkpoint_refuses_other_sizes_or_no_init_from(source, shards_rgb, tmp_path, capsys):  # noqa: F811
    folder = export(source[0], tmp_path / "ckpt")
    _openpi_stats(folder, {p: {"q01": [0.0] * 3, "q99": [1.0] * 3} for p in ("state", "action")})
    common = (f"data.shards={shards_rgb}", "train.steps=2", "data.norm_from=checkpoint")
    code, err = cli_run(capsys, *common, f"model.init_from={folder}", f"output.dir={tmp_path / 'a'}")
    assert code == 2 and "norm_stats.state.q01 has 3 values; the dataset's state has" in err and len(err.splitlines()) == 1, err
    code, err = cli_run(capsys, *common, f"output.dir={tmp_path / 'b'}")
    assert code == 2 and err.startswith("trainkit: data.norm_from:") and len(err.splitlines()) == 1, err


def test_an_openpi_export_carries_the_runs_statistics(shards_rgb, tmp_path, capsys):  # noqa: F811
    from datakit.shards.index import load_index
    from trainkit.cli import main
    from trainkit.weights.norm_stats import read_weights_stats

    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'run'}", "train.steps=1",
                        "output.checkpoint_every=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert code == 0, err
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out"), "--format", "openpi"]) == 0
    stats, path = read_weights_stats(tmp_path / "out")
    index = load_index(shards_rgb)
    assert path == tmp_path / "out" / "assets" / "trainkit" / "norm_stats.json"
    assert {p: {k: stats[p][k] for k in ("mean", "std", "q01", "q99")} for p in ("state", "action")} == \
        {p: {k: index.stats[p][k] for k in ("mean", "std", "q01", "q99")} for p in ("state", "action")}


def test_export_of_a_run_without_a_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    from trainkit.cli import main

    (tmp_path / "run").mkdir()
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out"), "--format", "lerobot"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no checkpoint to export" in err, err


def test_export_of_the_weight_ema(shards_rgb, tmp_path, capsys):  # noqa: F811
    """`--weights ema`: the checkpoint's EMA tensors (read back by DCP's own torch.save converter)."""
    from trainkit.config import TrainConfig

    if "ema_decay" not in TrainConfig.__dataclass_fields__:
        pytest.skip("no weight EMA (train.ema_decay) in this tree")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from trainkit.cli import main

    run = tmp_path / "run"
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={run}", "train.steps=2",
                        "train.ema_decay=0.5", "output.checkpoint_every=2", "parallel.fsdp=none",
                        "parallel.ac_stride={}")
    assert code == 0, err
    for weights in ("model", "ema"):
        assert main(["export", str(run), str(tmp_path / weights), "--format", "lerobot", "--weights", weights]) == 0
    dcp_to_torch_save(run / "checkpoints" / "step-000002", tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    for weights in ("model", "ema"):
        got = build_model("pi05", "tiny")
        load_weights(got, FAM, tmp_path / weights, lambda m: None)
        for name, p in got.named_parameters():
            assert torch.allclose(p, saved[weights][name], rtol=0, atol=1e-6), (weights, name)
    assert not torch.equal(saved["ema"]["action_out.weight"], saved["model"]["action_out.weight"])
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'plain'}", "train.steps=1",
                        "output.checkpoint_every=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert main(["export", str(tmp_path / "plain"), str(tmp_path / "x"), "--format", "lerobot", "--weights", "ema"]) == 2
    assert "holds no weight EMA" in capsys.readouterr().err

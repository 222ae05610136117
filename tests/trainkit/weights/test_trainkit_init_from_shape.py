"""`model.init_from` is enough (issue 26, item 2): the model's shape comes from the checkpoint.

The checkpoints are `trainkit export`s (openpi's format, and its tensors in LeRobot's layout: a
LeRobot export of 6 query heads is refused since issue 35) of a tiny run at widths, depths, heads, vocab,
chunk length and image size that are none of pi05_tiny.toml's; `trainkit run pi05_tiny.toml --set
model.init_from=CKPT` with no model setting must build that model and load it: the oracle of the
load is the source run's own checkpoint (every tensor equal after one step at lr 1e-12). A
contradicting setting is refused in one line naming both values and the file; `trainkit inspect`
reports the same shapes. Positive control: with the shape reading taken out, the same command
fails with the "shape mismatch" the issue reported. (LeRobot's own save_pretrained of a tiny PI05:
tests/trainkit/models/pi05/test_pi05_lerobot_parity.py.)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from trainkit.config import load_config
from trainkit.errors import CheckpointError, ConfigError
from trainkit.models import build_model, family
from trainkit.models.pi05.config import full, tiny
from trainkit.models.pi05 import weights as pi05_weights
from trainkit.weights.shape import with_weights_shape
from trainkit_fixtures import cli_run, shards_rgb  # noqa: F401 - fixture
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(180)
FAM = family("pi05")
# none of these is the tiny preset's: every one must come from the checkpoint
SHAPE = {"vision_width": 48, "vision_heads": 3, "vision_mlp": 80, "image_size": 24, "lm_width": 96, "lm_depth": 3,
         "lm_mlp": 160, "heads_q": 6, "heads_kv": 2, "head_dim": 8, "vocab": 700, "expert_width": 40,
         "expert_mlp": 48, "horizon": 10}
FAST = ("parallel.fsdp=none", "parallel.ac_stride={}")


def base(shards: Path, out: Path) -> tuple[str, ...]:
    """`--set`s of a fast CPU run of pi05_tiny.toml over `shards` into `out` (no model.* among them)."""
    return f"data.shards={shards}", f"output.dir={out}", "output.progress=false", "data.num_workers=0", *FAST


def run_args(shards: Path, out: Path, *sets: str) -> list[str]:
    return ["run", str(TINY), *[a for s in (*base(shards, out), *sets) for a in ("--set", s)]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, shards_rgb) -> Path:  # noqa: F811
    """root/src: a one-step run at SHAPE, checkpointed; root/lerobot, root/openpi: its exports."""
    from trainkit.cli import main

    root = tmp_path_factory.mktemp("shape")
    sets = [f"model.{k}={v}" for k, v in SHAPE.items()]
    assert main(run_args(shards_rgb, root / "src", *sets, "train.steps=1", "output.checkpoint_every=1")) == 0
    assert main(["export", str(root / "src"), str(root / "openpi"), "--format", "openpi"]) == 0
    # 6 query heads: `trainkit export --format lerobot` refuses it (LeRobot's attention takes 8), so the
    # LeRobot layout is the openpi export's tensors under LeRobot's names, as a custom checkpoint has them
    assert main(["export", str(root / "src"), str(root / "refused"), "--format", "lerobot"]) == 2
    return _lerobot_layout(root / "openpi", root / "lerobot").parent


def _lerobot_layout(openpi: Path, dst: Path) -> Path:
    """The openpi export `openpi` in LeRobot's layout (keys prefixed `model.`, the embedding also as
    embed_tokens), its metadata, config.json and tokenizer kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(openpi / "model.safetensors"), framework="pt") as f:
        tensors = {f"model.{k}": f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    embed = "model." + pi05_weights.EMBED
    tensors[embed] = tensors["model." + pi05_weights.LM_HEAD].clone()
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"), metadata=metadata)
    shutil.copy(openpi / "config.json", dst / "config.json")
    shutil.copytree(openpi / "tokenizer", dst / "tokenizer")
    return dst


def _config(folder: Path, *sets: str, toml: Path = TINY):
    return load_config(toml, [f"model.init_from={folder}", *sets], required=False)


@pytest.mark.parametrize("fmt", pi05_weights.FORMATS)
def test_init_from_alone_builds_and_loads_the_checkpoints_model(exported, shards_rgb, tmp_path, capsys, fmt):  # noqa: F811
    from trainkit.weights.export import load_run_model

    run = tmp_path / "run"
    code, err = cli_run(capsys, *base(shards_rgb, run), f"model.init_from={exported / fmt}",
                        "train.steps=1", "optim.lr=1e-12", "optim.warmup_steps=0", "output.checkpoint_every=1")
    assert code == 0, err
    assert f"model shape from model.init_from {exported / fmt}:" in err and "heads_q 6" in err, err
    got, cfg, _ = load_run_model(run)
    want, _, _ = load_run_model(exported / "src")
    assert {k: getattr(got.cfg, k) for k in SHAPE} == SHAPE
    assert cfg.model.overrides["lm_width"] == 96  # recorded: export and resume rebuild this model
    for (name, w), p in zip(want.named_parameters(), got.parameters()):
        assert p.shape == w.shape and torch.allclose(p, w, rtol=0, atol=1e-6), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["init_from"]["shape"]["head_dim"] == 8


def test_without_the_shape_reading_the_issues_shape_mismatch_returns(exported, shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                      monkeypatch):
    """Positive control: the trainer building the preset's shape, as before, fails on this checkpoint."""
    import trainkit.train

    monkeypatch.setattr(trainkit.train, "with_weights_shape", lambda cfg, run_dir=None: (cfg, {}))
    code, err = cli_run(capsys, *base(shards_rgb, tmp_path / "run"),
                        f"model.init_from={exported / 'lerobot'}", "train.steps=1")
    assert code == 2 and "shape mismatch" in err and len(err.splitlines()) == 1, err


def test_a_contradicting_setting_is_refused_naming_both_values_and_the_file(exported, shards_rgb, tmp_path,  # noqa: F811
                                                                           capsys):
    folder = exported / "lerobot"
    code, err = cli_run(capsys, *base(shards_rgb, tmp_path / "run"), f"model.init_from={folder}",
                        "model.lm_width=64", "train.steps=1")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("trainkit: model.lm_width: 64 contradicts") and "lm_width is 96" in err, err
    assert f"{folder}/model.safetensors" in err and not (tmp_path / "run" / "metrics.jsonl").exists(), err
    # one the TOML's [model] table sets is the same: the run's own setting
    toml = tmp_path / "heads.toml"
    toml.write_text(TINY.read_text().replace('preset = "tiny"', 'preset = "tiny"\nheads_q = 4'))
    with pytest.raises(ConfigError, match=r"model.heads_q: 4 contradicts .* heads_q is 6 .*q_proj.weight' rows 48"):
        with_weights_shape(_config(folder, toml=toml))
    # a setting that agrees with the checkpoint is accepted
    cfg, fixed = with_weights_shape(_config(folder, "model.lm_width=96", "model.head_dim=8"))
    assert cfg.model.overrides["lm_width"] == 96 and fixed["vocab"][0] == 700


def test_inspect_reports_the_checkpoints_shape(exported, capsys):
    from trainkit.cli import main

    folder = exported / "openpi"
    assert main(["inspect", str(TINY), "--set", f"model.init_from={folder}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {k: report["config"][k] for k in SHAPE} == SHAPE
    src = build_model("pi05", "tiny", SHAPE)
    assert report["params"]["total"] == sum(p.numel() for p in src.parameters())
    assert "__metadata__ trainkit.head_dim" in report["init_from"]["fields"]["head_dim"]["from"]
    assert main(["inspect", str(TINY), "--set", f"model.init_from={folder}"]) == 0
    assert f"shape from model.init_from {folder}: " in capsys.readouterr().out
    assert main(["inspect", str(TINY), "--json"]) == 0  # without init_from: the preset
    assert json.loads(capsys.readouterr().out)["config"]["lm_width"] == 64


def _without_metadata(src: Path, dst: Path) -> Path:
    """`src` as LeRobot or openpi would write it: no trainkit metadata in model.safetensors."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    save_file(load_file(str(src / "model.safetensors")), str(dst / "model.safetensors"))
    return dst


def test_a_head_size_no_file_states_is_refused_not_guessed(exported, shards_rgb, tmp_path, capsys):  # noqa: F811
    """Without trainkit's metadata, a config.json naming Gemma variants of other widths, and widths
    that are not the preset's: q_proj rows 48 are 6 x 8 or 3 x 16 heads; refused, and `model.head_dim`
    (plus `model.vision_heads`) answers it."""
    folder = _without_metadata(exported / "lerobot", tmp_path / "plain")
    code, err = cli_run(capsys, *base(shards_rgb, tmp_path / "run"), f"model.init_from={folder}",
                        "train.steps=1")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{folder / 'model.safetensors'}: cannot tell head_dim" in err and "set model.head_dim" in err, err
    with pytest.raises(CheckpointError, match="cannot tell vision_heads.*set model.vision_heads"):
        with_weights_shape(_config(folder, "model.head_dim=8"))
    cfg, fixed = with_weights_shape(_config(folder, "model.head_dim=8", "model.vision_heads=3"))
    assert (fixed["heads_q"][0], fixed["heads_kv"][0]) == (6, 2)
    assert {k: cfg.model.overrides[k] for k in SHAPE} == SHAPE


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(type="pi0"), "config.json: type 'pi0': not a Pi0.5 policy"),
    (lambda c: c.update(image_resolution=[224, 224]), "config.json: image_resolution [224, 224] differs from the "
                                                      "tensors' 24 x 24"),
    (lambda c: c.update(max_action_dim=7), "config.json: max_action_dim 7 differs from the tensors' 32"),
    (lambda c: c.update(chunk_size="50"), "config.json: chunk_size is '50', not a positive integer"),
], ids=["other_policy", "image_resolution", "max_action_dim", "chunk_size_text"])
def test_a_config_json_that_contradicts_the_tensors_is_refused(exported, tmp_path, edit, says):
    folder = tmp_path / "ckpt"
    shutil.copytree(exported / "lerobot", folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as e:
        with_weights_shape(_config(folder))
    assert f"{folder}/{says}" in str(e.value), e.value


def test_full_size_shape_from_the_names_alone():
    """pi05_base's case: no trainkit metadata, full widths; head_dim 256 from config.json's Gemma
    variants, 16 SigLIP heads from So400m's width: exactly the `full` preset, from a tiny one."""
    from trainkit.models import WeightsFiles

    with torch.device("meta"):
        model = build_model("pi05", "full")
    for fmt in pi05_weights.FORMATS:
        tensors = pi05_weights.export_tensors(model.cfg, model.state_dict(), fmt)
        config = pi05_weights.policy_config(model.cfg, {"cameras": ["a"], "state_dim": 8, "action_dim": 7})
        ckpt = WeightsFiles(shapes={k: tuple(v.shape) for k, v in tensors.items()}, config=config, metadata={})
        fixed = pi05_weights.config_from_weights(ckpt, tiny(), {})
        assert {k: v for k, (v, _) in fixed.items()} == {k: getattr(full(), k) for k in fixed}, fmt
        assert "gemma_2b" in fixed["head_dim"][1] and "So400m" in fixed["vision_heads"][1]


def test_a_resume_rebuilds_the_recorded_shape_without_init_from(exported, shards_rgb, tmp_path, capsys):  # noqa: F811
    folder = tmp_path / "ckpt"
    shutil.copytree(exported / "lerobot", folder)
    run = base(shards_rgb, tmp_path / "run")
    code, err = cli_run(capsys, *run, f"model.init_from={folder}", "train.steps=1", "output.checkpoint_every=1")
    assert code == 0, err
    shutil.rmtree(folder)  # a resume reads neither its weights nor its shape
    code, err = cli_run(capsys, *run, f"model.init_from={folder}", "train.steps=2", "output.checkpoint_every=1")
    assert code == 0 and "model.init_from" not in err, err
    from trainkit.weights.export import load_run_model
    assert load_run_model(tmp_path / "run")[0].cfg.lm_width == 96


@pytest.mark.parametrize("config,says", [("gr00t_tiny.toml", "not a GR00T N1.7 c")])
def test_a_family_without_a_checkpoint_mapping_says_so(exported, shards_rgb, tmp_path, capsys, config, says):  # noqa: F811
    """A Pi0.5 checkpoint given to another family: gr00t refuses it as not its own."""
    from trainkit.cli import main

    args = run_args(shards_rgb, tmp_path / "run", f"model.init_from={exported / 'lerobot'}", "train.steps=1")
    args[1] = str(TINY.parent / config)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err

"""`python -m datakit.lerobot.train`: LeRobot 0.6.1's own `lerobot-train` on shards (its own venv).

ACT and diffusion (small widths, CPU) train 20 steps on a shard folder with falling loss and write
LeRobot's checkpoint, which lerobot loads (policy, processors) and runs on a shard item; ACT then
resumes through lerobot-train's own `--resume` to step 24. Only what LeRobot itself writes and
reads is checked. Skipped without /tmp/lerobot-venv/.ready (needs lerobot 0.6.1 + accelerate).
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from datakit.lerobot.train import with_repo_id

LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ROOT = Path(__file__).resolve().parents[3]
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason="no lerobot venv at /tmp/lerobot-venv")
SMALL = {
    "act": ["--policy.dim_model=64", "--policy.dim_feedforward=128", "--policy.chunk_size=8",
            "--policy.n_action_steps=8", "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
            "--policy.optimizer_lr=1e-3", "--policy.optimizer_lr_backbone=1e-3"],
    "diffusion": ["--policy.crop_shape=null", "--policy.down_dims=[32,64]", "--policy.diffusion_step_embed_dim=32",
                  "--policy.horizon=8", "--policy.n_action_steps=4", "--policy.optimizer_lr=1e-3",
                  "--policy.scheduler_warmup_steps=0"],
}


def _lerobot(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(LEROBOT_PY), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)


def _train(*flags: str) -> list[float]:
    """Run the command; the losses lerobot-train logged (one per log window)."""
    r = _lerobot("-m", "datakit.lerobot.train", *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    return [float(x) for x in re.findall(r"step:\d+ .*? loss:([0-9.]+)", r.stdout + r.stderr)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("train")
    src = make_lerobot_dataset(root / "src", version="v3.0", episode_lengths=(12, 10), height=32, width=64,
                               cameras=("observation.images.top",), blank_cameras=())
    convert(src, root / "out", ConvertConfig(workers=1, progress=False))
    return root / "out"


def test_repo_id_defaults_to_the_folder_name():
    assert with_repo_id(["--dataset.root=/data/out/"]) == ["--dataset.root=/data/out/", "--dataset.repo_id=datakit/out"]
    assert with_repo_id(["--dataset.root=/x", "--dataset.repo_id=me/y"]) == ["--dataset.root=/x", "--dataset.repo_id=me/y"]
    assert with_repo_id(["--config_path=c.json"]) == ["--config_path=c.json"]


@needs_lerobot
@pytest.mark.parametrize("policy", ["act", "diffusion"])
def test_lerobot_train_on_shards(shards, tmp_path, policy):
    out = tmp_path / "run"
    losses = _train(f"--policy.type={policy}", f"--dataset.root={shards}", "--steps=20", "--batch_size=4",
                    "--policy.device=cpu", "--policy.push_to_hub=false", f"--output_dir={out}",
                    "--policy.pretrained_backbone_weights=null", "--log_freq=10", "--save_freq=20",
                    "--num_workers=0", *SMALL[policy])
    assert len(losses) == 2 and losses[1] < losses[0], losses
    ckpt = out / "checkpoints" / "last"
    assert json.loads((ckpt / "training_state" / "training_step.json").read_text())["step"] == 20
    # lerobot loads what it wrote and runs it on a shard item
    check = f"""
import torch
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from datakit.lerobot import ShardLeRobotDataset
path = "{ckpt / 'pretrained_model'}"
policy = get_policy_class("{policy}").from_pretrained(path)
pre, post = make_pre_post_processors(policy.config, pretrained_path=path)
item = ShardLeRobotDataset("{shards}")[3]
batch = {{k: (v[None] if isinstance(v, torch.Tensor) else [v]) for k, v in item.items()}}
policy.eval()
action = post(policy.select_action(pre(batch)))
print("ACTION", tuple(action.shape))
"""
    r = _lerobot("-c", check)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ACTION (1, 6)" in r.stdout
    if policy == "act":  # lerobot-train's own --resume continues the run
        cfg = ckpt / "pretrained_model" / "train_config.json"
        losses = _train(f"--config_path={cfg}", "--resume=true", "--steps=24", "--log_freq=2", "--save_freq=24")
        assert len(losses) == 2
        assert json.loads((ckpt / "training_state" / "training_step.json").read_text())["step"] == 24

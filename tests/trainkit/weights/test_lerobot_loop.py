"""The loop a LeRobot user runs, in one CPU test (issue 26, "Tests and bars"): a LeRobot checkpoint ->
`trainkit run pi05_finetune` -> `trainkit export --format lerobot` -> LeRobot serves it as trainkit
predicts.

1. A tiny PI05Policy saved by LeRobot 0.6.1's own `save_pretrained` (tools/lerobot_oracle/pi05_oracle.py,
   every parameter random; skipped without the oracle venv).
2. The held-out-like dataset as it is: LeRobot v3.0, a 120x160 scene camera, a 96x128 wrist camera and
   a blank one, converted by datakit without --resize (tests/fixtures/loader_fixtures.py's `sizes_rgb`).
3. `trainkit run pi05_finetune` by preset name, `model.init_from` = the LeRobot folder and no model
   shape setting: every width, depth, head count, vocab, chunk and image size comes from the
   checkpoint (heads_q 8 where pi05_tiny says 4). One exception, `model.preset=tiny`: the head size
   and SigLIP head count are in no tensor shape (q_proj rows = heads x head size) and this tiny
   checkpoint's config.json names Gemma variants of other widths (only a patched LeRobot builds it),
   so the preset whose widths are the checkpoint's supplies them (trainkit/models/pi05/weights.py
   `_head_dim`); a real pi05_base is read whole from `full` (gemma_2b/gemma_300m, So400m). The other
   `--set`s only make it a few CPU steps, plus `model.tokenizer` (a SentencePiece file, so that
   LeRobot's tokenizer step loads the same prompt tokenizer offline, test_trainkit_export_serving.py).
4. `trainkit export RUN EXP --format lerobot`.
5. `trainkit predict RUN --shards OUT --episodes E` (frame 0's chunk, the first `len(E)` actions kept)
   against LeRobot on EXP alone: `make_pre_post_processors` + `select_action` on the raw observation
   of the same frame (uint8 frames at their stored sizes, the state from the source parquet, the
   task string; the blank camera left out) with the flow noise predict drew for that frame
   (tools/lerobot_oracle/pi05_serve_oracle.py replaces `sample_noise` by it).

Tolerance: relative 2e-5 of the chunk's largest value, the parity test's on the velocity
(tests/trainkit/models/pi05/test_pi05_lerobot_parity.py). Both resize with pad from the stored size to 16x16; LeRobot scales
to [0, 1] before resizing and to [-1, 1] after, trainkit resizes the uint8 values and scales once, so
the pixels differ by float32 rounding (~1e-6 after scaling, tests/trainkit/train/test_trainkit_camera_sizes.py), below
what the tolerance holds the action chunk to. Positive controls that must fail the same comparison:
predict with another noise seed, and the export with the action's q01/q99 swapped in the
postprocessor (the statistics the actions are unnormalised with).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from loader_fixtures import CAMS, SIZES, sizes_rgb  # noqa: F401 - session fixture

ROOT = Path(__file__).resolve().parents[3]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle"
TOLERANCE = 2e-5  # tests/trainkit/models/pi05/test_pi05_lerobot_parity.py's
EPISODE = 1  # 31 frames: the chunk's first 31 actions are compared
SEED = 3  # predict --seed

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                 reason=f"no lerobot venv at {LEROBOT_PY.parents[1]} (make lerobot-oracle)")]
spm = pytest.importorskip("sentencepiece")


def lerobot(script: str, *args: str | Path, timeout: int = 200) -> None:
    """Run one of tools/lerobot_oracle/ in the LeRobot venv; its stderr on failure."""
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE / script), *map(str, args)], capture_output=True, text=True, check=False,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]


def cli(*args: str | Path) -> None:
    from trainkit.cli import main

    assert main([str(a) for a in args]) == 0


def sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def raw_observation(src: Path, out: Path, episode: int) -> dict[str, np.ndarray]:
    """Frame 0 of `episode` as a robot gives it: each camera's uint8 (H, W, 3) frame at its stored size
    (the blank camera left out), the state from the source dataset's parquet, the task string."""
    from datakit.reader import ShardReader

    rows = [r for f in sorted((src / "data").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    first = next(r for r in rows if r["episode_index"] == episode and r["frame_index"] == 0)
    reader = ShardReader(out)
    try:
        row = reader.row(episode, 0)
        obs = {f"image/{cam}": np.array(reader.read_raw(row, cam)) for cam in CAMS[:2]}
        obs["task"] = np.array(reader.index.tasks[int(first["task_index"])])
    finally:
        reader.close()
    for cam in CAMS[:2]:
        assert obs[f"image/{cam}"].shape == (*SIZES[cam], 3) and obs[f"image/{cam}"].any()
    obs["state"] = np.asarray(first["observation.state"], dtype=np.float32)
    obs["row"] = np.array(row)
    return obs


def swap_action_quantiles(folder: Path) -> None:
    """The postprocessor's action q01 and q99 exchanged: actions unnormalised with wrong statistics."""
    from safetensors.torch import load_file, save_file

    pipe = json.loads((folder / "policy_postprocessor.json").read_text())
    state_file = folder / next(s["state_file"] for s in pipe["steps"] if "state_file" in s)
    t = load_file(str(state_file))
    t["action.q01"], t["action.q99"] = t["action.q99"].clone(), t["action.q01"].clone()
    save_file(t, str(state_file))


@pytest.fixture(scope="module")
def loop(tmp_path_factory, sizes_rgb):  # noqa: F811
    """Every step of the loop; returns (LeRobot's outputs per export, predict.json per seed, the run)."""
    from test_trainkit_export_serving import train_sentencepiece

    from trainkit.models import family
    from trainkit.predict.chunks import sample_noise
    from trainkit.weights.export import load_run_model

    src, out = sizes_rgb
    root = tmp_path_factory.mktemp("loop")
    lerobot("pi05_oracle.py", root)  # root/policy: LeRobot's save_pretrained of a tiny PI05Policy
    tokenizer = train_sentencepiece(root / "tokenizer.model")
    run = root / "run"
    cli("run", "pi05_finetune", *sets(
        f"data.shards={out}", f"model.init_from={root / 'policy'}", f"model.tokenizer={tokenizer}",
        "model.preset=tiny",
        f"output.dir={run}", "output.progress=false", "output.log_every=1", "train.steps=2", "train.micro_batch=2",
        "train.global_batch=2", "output.checkpoint_every=2", "optim.warmup_steps=1", "data.num_workers=0", "parallel.fsdp=none",
        "parallel.compile=false", "parallel.param_dtype=float32", "optim.fused=false"))
    cli("export", run, root / "export", "--format", "lerobot")
    swapped = shutil.copytree(root / "export", root / "swapped")
    swap_action_quantiles(swapped)

    obs = raw_observation(src, out, EPISODE)
    model, _, _ = load_run_model(run)
    shapes = family("pi05").sampler.noise_shapes(model.cfg)
    obs["noise"] = sample_noise(shapes, SEED, torch.tensor([int(obs["row"])]))[0].numpy()  # what predict draws
    np.savez(root / "obs.npz", **obs)
    lerobot("pi05_serve_oracle.py", root / "obs.npz", root / "lerobot.npz", root / "export", swapped)

    predicted = {}
    for seed in (SEED, SEED + 1):
        cli("predict", run, "--shards", out, "--episodes", str(EPISODE), "--seed", str(seed), "--device", "cpu",
            "--out", root / f"predict{seed}")
        body = json.loads((root / f"predict{seed}" / "predict.json").read_text())
        predicted[seed] = np.asarray(body["episodes"][0]["predicted"])
    return dict(np.load(root / "lerobot.npz")), predicted, run, model


def rel(theirs: np.ndarray, ours: np.ndarray) -> float:
    return float(np.abs(theirs - ours).max() / np.abs(ours).max())


def test_lerobot_serves_the_fine_tuned_export_as_trainkit_predicts(loop):
    theirs, predicted, run, model = loop
    ours = predicted[SEED]
    n = ours.shape[0]
    assert theirs["0/actions"].shape == (1, 50, ours.shape[1]) and n == 31
    print(f"loop: max abs diff {np.abs(theirs['0/actions'][0, :n] - ours).max():.3g}, max rel diff "
          f"{rel(theirs['0/actions'][0, :n], ours):.3g} (largest action {np.abs(ours).max():.3g})")
    assert rel(theirs["0/actions"][0, :n], ours) < TOLERANCE
    # the shape came from the LeRobot checkpoint: 8 query heads (pi05_tiny's preset says 4)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["init_from"]["shape"]["heads_q"] == 8 == model.cfg.heads_q


def test_other_noise_or_swapped_action_statistics_fail_the_comparison(loop):
    theirs, predicted, _, _ = loop
    n = predicted[SEED].shape[0]
    other_noise = rel(theirs["0/actions"][0, :n], predicted[SEED + 1])
    swapped = rel(theirs["1/actions"][0, :n], predicted[SEED])
    print(f"controls: other noise rel diff {other_noise:.3g}, swapped action q01/q99 rel diff {swapped:.3g}")
    assert other_noise > 100 * TOLERANCE and swapped > 100 * TOLERANCE

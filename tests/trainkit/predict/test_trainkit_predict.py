"""`trainkit predict`: open-loop action chunks from a checkpoint, and their error in the robot's units.

Oracles: a hand-written Euler loop over each family's training-path velocity (with the wrong sign
of dt as the positive control), numpy over the JSON's own arrays for every error number, the
source LeRobot parquet for the recorded actions, numpy's quantile / mean-std inverse for the
unnormalisation, and LeRobot 0.6.1's `PI05Pytorch.sample_actions` on the same exported weights,
batch and noise (tools/lerobot_oracle/pi05_sample_oracle.py; skipped without the oracle venv).
Bad input: one line, exit 2, no --out folder.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from trainkit.models import build_model, family
from trainkit_fixtures import other_shards, shards_rgb  # noqa: F401 - session fixtures
from trainkit_harness import TINY

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "trainkit" / "configs"
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
SAMPLE_ORACLE = ROOT / "tools" / "lerobot_oracle" / "pi05_sample_oracle.py"
HELD_OUT = 2  # data.val_fraction = 0.25 of 4 episodes holds out episode floor(0.5 x 4 / 1) = 2
ROBOT_DIMS = 6  # the fixture's action channels

pytestmark = pytest.mark.timeout(300)


def train(config: Path, shards: Path, out: Path, *sets: str) -> Path:
    from trainkit.cli import main

    base = (f"data.shards={shards}", f"output.dir={out}", "output.progress=false", "data.num_workers=0",
            "parallel.fsdp=none", "train.steps=3", "output.checkpoint_every=3", *sets)
    assert main(["run", str(config), *[a for s in base for a in ("--set", s)]]) == 0
    return out


@pytest.fixture(scope="module")
def pi05_run(shards_rgb, tmp_path_factory) -> Path:  # noqa: F811
    """A tiny Pi0.5 run LeRobot can load (8 query heads), with a holdout and a weight EMA."""
    return train(TINY, shards_rgb, tmp_path_factory.mktemp("predict") / "pi05", "model.heads_q=8",
                 "data.val_fraction=0.25", "train.ema_decay=0.5")


def predict(capsys, source: Path, shards: Path, out: Path, *flags: str) -> tuple[int, dict | None, str]:
    """`trainkit predict` in this process: (exit code, predict.json or None, stderr)."""
    from trainkit.cli import main

    code = main(["predict", str(source), "--shards", str(shards), "--out", str(out), "--device", "cpu", *flags])
    err = capsys.readouterr().err
    body = json.loads((out / "predict.json").read_text()) if code == 0 else None
    return code, body, err


def test_a_runs_validation_episodes_give_a_table_json_and_png(pi05_run, shards_rgb, tmp_path, capsys):  # noqa: F811
    from trainkit.cli import main

    out = tmp_path / "p"
    assert main(["predict", str(pi05_run), "--shards", str(shards_rgb), "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "open-loop action error" in printed and "motor_5" in printed and "predict.json" in printed
    body = json.loads((out / "predict.json").read_text())
    assert [e["episode_index"] for e in body["episodes"]] == [HELD_OUT] and body["trained_on"] == []
    assert "validation" in body["episodes_from"] and "the run's dataset" in body["stats_from"]
    assert (body["family"], body["steps"], body["horizon"], body["every"], body["step"]) == ("pi05", 10, 50, 50, 3)
    assert np.asarray(body["episodes"][0]["predicted"]).shape == (17, ROBOT_DIMS)
    assert np.isfinite(np.asarray(body["episodes"][0]["predicted"])).all()
    assert (out / "predict.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == ["predict.json", "predict.png"]  # no temporary left


def test_every_error_is_numpy_over_the_jsons_arrays_and_recorded_is_the_source(
        pi05_run, shards_rgb, tmp_path, capsys):  # noqa: F811
    import pyarrow.parquet as pq

    code, body, err = predict(capsys, pi05_run, shards_rgb, tmp_path / "p", "--episodes", "0-1,3", "--every", "7")
    assert code == 0, err
    assert body["trained_on"] == [0, 1, 3] and "not a held-out one" in err
    pred = [np.asarray(e["predicted"]) for e in body["episodes"]]
    rec = [np.asarray(e["recorded"]) for e in body["episodes"]]
    for e, p, r in zip(body["episodes"], pred, rec):
        src = shards_rgb.parent / "src" / f"data/chunk-000/episode_{e['episode_index']:06d}.parquet"
        assert np.allclose(r, np.stack(pq.read_table(src)["action"].to_numpy(zero_copy_only=False)), rtol=0, atol=1e-6)
        assert e["frames"] == len(p) == len(r)
        assert np.isclose(e["mse"], ((p - r) ** 2).mean(), rtol=1e-12)
        assert np.isclose(e["mae"], np.abs(p - r).mean(), rtol=1e-12)
        assert np.allclose(e["mse_per_dim"], ((p - r) ** 2).mean(axis=0), rtol=1e-12)
        assert np.allclose(e["mae_per_dim"], np.abs(p - r).mean(axis=0), rtol=1e-12)
    p, r = np.concatenate(pred), np.concatenate(rec)
    assert body["frames"] == len(p) == 24 + 31 + 9 and body["chunks"] == 4 + 5 + 2
    assert np.isclose(body["overall"]["mse"], ((p - r) ** 2).mean(), rtol=1e-12)
    assert np.allclose(body["overall"]["mae_per_dim"], np.abs(p - r).mean(axis=0), rtol=1e-12)
    assert not np.isclose(body["overall"]["mse"], np.mean([e["mse"] for e in body["episodes"]]))  # pooled, by frames


def test_predicted_actions_are_the_sampled_chunks_unnormalised(
        pi05_run, shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Every predicted value is a sampled chunk's action, mapped back with numpy's quantile inverse
    of the run's statistics: chunk k of an episode gives frames k x every .. k x every + every - 1."""
    from datakit.shards.index import load_index

    captured = capture_samples(monkeypatch)
    code, body, _ = predict(capsys, pi05_run, shards_rgb, tmp_path / "p", "--every", "5", "--batch-size", "2")
    assert code == 0
    stats = load_index(shards_rgb).stats["action"]
    q01, q99 = np.asarray(stats["q01"]), np.asarray(stats["q99"])
    sampled = np.concatenate([c.numpy() for c in captured["chunk"]])  # 4 chunks of episode 2
    want = (sampled + 1) / 2 * (q99 - q01) + q01
    got = np.asarray(body["episodes"][0]["predicted"])
    for k in range(4):
        n = min(5, 17 - 5 * k)
        assert np.allclose(got[5 * k:5 * k + n], want[k, :n], rtol=1e-5, atol=1e-5), k
    assert not np.allclose(got[:5], sampled[0, :5], atol=1e-3)  # normalised != unnormalised here


def capture_samples(monkeypatch) -> dict[str, list]:
    """What predict samples, batch by batch: "batch" (the family's model batch), "noise" (its flow
    noise) and "chunk" (the sampled chunk's robot channels, before unnormalisation), recorded by
    wrapping the three steps of trainkit.predict.chunks."""
    from trainkit.predict import chunks

    seen: dict[str, list] = {"batch": [], "noise": [], "chunk": []}

    def recording(real, key, record_input=False):
        def wrapped(*a, **k):
            out = real(*a, **k)
            seen[key].append(a[0] if record_input else out)
            return out
        return wrapped

    monkeypatch.setattr(chunks, "model_batch", recording(chunks.model_batch, "batch"))
    monkeypatch.setattr(chunks, "sample_noise", recording(chunks.sample_noise, "noise"))
    monkeypatch.setattr(chunks, "unnormalise", recording(chunks.unnormalise, "chunk", record_input=True))
    return seen


def test_noise_is_a_function_of_seed_and_row_not_of_the_batch(pi05_run, shards_rgb, tmp_path, capsys):  # noqa: F811
    runs = {}
    for name, flags in (("b1", ("--batch-size", "1")), ("b3", ("--batch-size", "3")), ("seed1", ("--seed", "1"))):
        code, body, _ = predict(capsys, pi05_run, shards_rgb, tmp_path / name, "--every", "4", *flags)
        assert code == 0
        runs[name] = np.asarray(body["episodes"][0]["predicted"])
    assert np.allclose(runs["b1"], runs["b3"], rtol=0, atol=1e-5)
    assert not np.allclose(runs["b1"], runs["seed1"], atol=1e-3)


def test_ema_weights_and_their_export_predict_alike(pi05_run, shards_rgb, tmp_path, capsys):  # noqa: F811
    """--weights ema reads the EMA; the same weights exported (with the run's statistics beside
    them) and predicted as a checkpoint folder give the same actions."""
    from trainkit.cli import main

    got = {}
    for weights in ("model", "ema"):
        code, body, _ = predict(capsys, pi05_run, shards_rgb, tmp_path / weights, "--weights", weights)
        assert code == 0
        got[weights] = np.asarray(body["episodes"][0]["predicted"])
    assert not np.allclose(got["model"], got["ema"], atol=1e-4)
    export = tmp_path / "export"
    assert main(["export", str(pi05_run), str(export), "--format", "lerobot", "--weights", "ema"]) == 0
    code, body, _ = predict(capsys, export, shards_rgb, tmp_path / "folder", "--episodes", str(HELD_OUT),
                            "--config", str(TINY), "--set", "model.heads_q=8")
    assert code == 0 and body["step"] is None and body["stats_from"].endswith("policy_preprocessor.json")
    assert np.allclose(np.asarray(body["episodes"][0]["predicted"]), got["ema"], rtol=1e-5, atol=1e-5)


def test_a_moved_dataset_is_still_the_runs(pi05_run, shards_rgb, other_shards, tmp_path, capsys):  # noqa: F811
    """The run's dataset is known by its checksums: with its data.shards gone, the same dataset
    elsewhere predicts with the holdout and its statistics; another dataset cannot (statistics unknown)."""
    moved = tmp_path / "run"
    shutil.copytree(pi05_run, moved)
    for manifest in moved.glob("checkpoints/*/trainkit.json"):  # not covered by its own hashes
        doc = json.loads(manifest.read_text())
        doc["config"]["data"]["shards"] = str(tmp_path / "gone")
        manifest.write_text(json.dumps(doc))
    code, body, _ = predict(capsys, moved, shards_rgb, tmp_path / "same")
    assert code == 0 and [e["episode_index"] for e in body["episodes"]] == [HELD_OUT]
    code, _, err = predict(capsys, moved, other_shards, tmp_path / "other")
    assert code == 2 and "statistics it trained with are unknown" in err and not (tmp_path / "other").exists()
    # with the run's own folder readable, another dataset of the same shape is predicted with the run's statistics
    code, body, _ = predict(capsys, pi05_run, other_shards, tmp_path / "other_ok")
    assert code == 0 and body["stats_from"] == f"{shards_rgb} (the run's dataset)"
    assert body["episodes_from"] == "every episode of --shards" and body["trained_on"] == []


@pytest.mark.parametrize("case", ["empty_run", "missing", "episode_not_in_shards", "bad_episodes",
                                  "folder_without_config", "config_with_a_run", "every_beyond_horizon",
                                  "other_action_channels", "folder_with_another_norm"])
def test_bad_input_is_one_line_and_exit_2(case, pi05_run, shards_rgb, shards_3cam, tmp_path, capsys):  # noqa: F811
    from trainkit.cli import main

    export = tmp_path / "export"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"")
    (tmp_path / "empty_run").mkdir()
    if case == "folder_with_another_norm":
        assert main(["export", str(pi05_run), str(tmp_path / "real"), "--format", "lerobot"]) == 0
        capsys.readouterr()  # the export's own lines (its notes) are not predict's
    source, shards, flags, says = {
        "empty_run": (tmp_path / "empty_run", shards_rgb, (), "no checkpoint to predict from"),
        "missing": (tmp_path / "nope", shards_rgb, (), "not a run folder"),
        "episode_not_in_shards": (pi05_run, shards_rgb, ("--episodes", "2,99"), "episodes [99], which the shards lack"),
        "bad_episodes": (pi05_run, shards_rgb, ("--episodes", "2-x"), "a comma list of episode indices"),
        "folder_without_config": (export, shards_rgb, (), "needs --config"),
        "config_with_a_run": (pi05_run, shards_rgb, ("--config", str(TINY)), "carries its own config"),
        "every_beyond_horizon": (pi05_run, shards_rgb, ("--every", "51"), "--every: must be 1..50"),
        "other_action_channels": (pi05_run, shards_3cam, (), "7 action channels; the run trained on 6"),
        "folder_with_another_norm": (tmp_path / "real", shards_rgb, ("--config", str(TINY), "--set", "model.heads_q=8",
                                     "--set", "data.norm=mean_std"), "ACTION is QUANTILES (data.norm = 'quantile')"),
    }[case]
    code, _, err = predict(capsys, source, shards, tmp_path / "out", *flags)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainkit: ") and says in lines[0], err
    assert not (tmp_path / "out").exists()


# --- the samplers -------------------------------------------------------------------------------

def tiny_batch(name: str, cfg, b: int = 3):
    """A random batch of family `name` at `cfg`'s shapes (a masked slot, padded text)."""
    g = torch.Generator().manual_seed(7)
    randn = lambda *s: torch.randn(s, generator=g)  # noqa: E731
    if name == "dreamzero":
        from trainkit.models.dreamzero import DreamZeroBatch

        h, w = cfg.latent_hw
        f = cfg.latent_frames
        return DreamZeroBatch(latents=randn(b, cfg.latent_channels, f, h, w), cond=torch.zeros(b, 0, f, h, w),
                              text=randn(b, cfg.text_len, cfg.text_width), image=randn(b, cfg.image_tokens, cfg.image_width),
                              state=randn(b, cfg.state_tokens, cfg.state_dim), actions=randn(b, cfg.horizon, cfg.action_dim),
                              action_mask=torch.ones(b, cfg.horizon, cfg.action_dim),
                              noise=randn(b, cfg.latent_channels, f, h, w), action_noise=randn(b, cfg.horizon, cfg.action_dim),
                              sigma=torch.rand((b, f), generator=g), weight=torch.ones(b, f))
    size = (cfg.image_size,) * 2 if name == "pi05" else (cfg.image_height, cfg.image_width)
    image_mask = torch.tensor([[True, True], [True, False], [True, True]])[:b]
    token_mask = torch.arange(cfg.text_len)[None] < torch.tensor([cfg.text_len, 9, 17])[:b, None]
    common = dict(images=randn(b, 2, 3, *size), image_mask=image_mask,
                  tokens=torch.randint(1, cfg.vocab, (b, cfg.text_len), generator=g) * token_mask,
                  token_mask=token_mask,
                  actions=randn(b, cfg.horizon, cfg.action_dim), noise=randn(b, cfg.horizon, cfg.action_dim),
                  time=torch.rand(b, generator=g))
    if name == "pi05":
        from trainkit.models.pi05 import Pi05Batch

        return Pi05Batch(**common)
    from trainkit.models.gr00t import Gr00tBatch

    return Gr00tBatch(**common, state=randn(b, cfg.state_dim), state_drop=torch.tensor([False, True, False])[:b],
                      action_mask=torch.ones(b, cfg.horizon, cfg.action_dim, dtype=torch.bool))


def hand_euler(name: str, model, batch, noise: tuple[torch.Tensor, ...], steps: int, sign: float = 1.0) -> torch.Tensor:
    """Each family's Euler loop written out over its training-path velocity: the noisy point is
    handed in as noise = actions = x (so t x + (1 - t) x is x), never through the sampler's x_t."""
    r = dataclasses.replace
    with torch.no_grad():
        if name == "pi05":  # t from 1 down to 0
            x = noise[0]
            for i in range(steps):
                t = torch.full((x.shape[0],), 1.0 - i / steps)
                x = x - sign * model.velocity(r(batch, noise=x, actions=x, time=t)) / steps
            return x
        if name == "gr00t":  # t from 0 up to 1, the head on the VL features of the training path
            vl, image_mask, keep, seen = model.vl_features(batch)
            n_image = batch.images.shape[1] * model.cfg.tokens_per_image
            x = noise[0]
            for i in range(steps):
                t = torch.full((x.shape[0],), i / steps)
                v, _ = model.action_head(vl, image_mask, keep, seen, n_image, r(batch, noise=x, actions=x, time=t))
                x = x + sign * v / steps
            return x
        xv, xa = noise  # dreamzero: latents and actions together, every frame at one sigma, shifted grid 1 -> 0
        shift = model.cfg.shift
        sig = [shift * s / (1 + (shift - 1) * s) for s in (1.0 - i / steps for i in range(steps))] + [0.0]
        for i in range(steps):
            pv, pa, _ = model.velocities(r(batch, sigma=torch.full(batch.sigma.shape, sig[i])), xv, xa)
            dt = sig[i + 1] - sig[i]
            xv, xa = xv + sign * dt * model.unpatchify(pv, xv.shape[-2:]), xa + sign * dt * pa
        return xa


def tiny_model(name: str) -> torch.nn.Module:
    """The tiny preset with N(0, 0.1) added to every parameter: the init's zero modulations and small
    outputs would leave the velocity near zero, and every control below would pass by accident."""
    torch.manual_seed(0)
    model = build_model(name, "tiny").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("name", ["pi05", "gr00t", "dreamzero"])
def test_the_sampler_is_a_hand_written_euler_loop(name):
    model = tiny_model(name)
    fam = family(name)
    batch = tiny_batch(name, model.cfg)
    g = torch.Generator().manual_seed(3)
    noise = tuple(torch.randn((3, *s), generator=g) for s in fam.sampler.noise_shapes(model.cfg))
    steps = fam.sampler.steps
    got = fam.sampler.sample(model, batch, noise, steps)
    assert got.shape == (3, model.cfg.horizon, model.cfg.action_dim) and got.dtype == torch.float32
    want = hand_euler(name, model, batch, noise, steps)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    wrong = hand_euler(name, model, batch, noise, steps, sign=-1.0)  # positive control: dt of the wrong sign
    assert (got - wrong).abs().max() > 1e-3
    fewer = fam.sampler.sample(model, batch, noise, max(1, steps // 2))
    assert (got - fewer).abs().max() > 1e-4  # the step count matters too
    assert {"pi05": 10, "gr00t": 4, "dreamzero": 16}[name] == steps


@pytest.mark.parametrize("name", ["pi05", "gr00t", "dreamzero"])
def test_the_sampler_never_reads_the_recorded_actions(name):
    """The recorded actions, training noise and time of the batch are NaN: the chunk is unchanged."""
    model = tiny_model(name)
    fam = family(name)
    batch = tiny_batch(name, model.cfg)
    nan = {f: torch.full_like(getattr(batch, f), float("nan"))
           for f in ("actions", "noise", "video_noise", "action_noise", "time", "sigma", "weight") if hasattr(batch, f)}
    g = torch.Generator().manual_seed(3)
    noise = tuple(torch.randn((3, *s), generator=g) for s in fam.sampler.noise_shapes(model.cfg))
    clean = fam.sampler.sample(model, batch, noise, 2)
    assert torch.isfinite(clean).all()
    assert torch.equal(fam.sampler.sample(model, dataclasses.replace(batch, **nan), noise, 2), clean)


@pytest.mark.parametrize("mode", ["quantile", "mean_std"])
def test_unnormalise_inverts_the_loaders_normalisation(mode):
    from datakit.loader.normalise import affine_from_stats
    from trainkit.predict.chunks import unnormalise

    rng = np.random.default_rng(0)
    lo = rng.normal(size=5)
    stats = {"q01": lo.tolist(), "q99": (lo + rng.uniform(0.1, 3, 5)).tolist(), "mean": rng.normal(size=5).tolist(),
             "std": rng.uniform(0.1, 2, 5).tolist()}
    y = rng.normal(size=(4, 7, 5))
    if mode == "quantile":
        q01, q99 = np.asarray(stats["q01"]), np.asarray(stats["q99"])
        want = (y + 1) / 2 * (q99 - q01) + q01
    else:
        want = y * np.asarray(stats["std"]) + np.asarray(stats["mean"])
    got = unnormalise(torch.from_numpy(y), stats, mode).numpy()
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    scale, bias = affine_from_stats(stats, mode)  # and back through the loader's own map
    assert np.allclose(got * scale.double().numpy() + bias.double().numpy(), y, atol=1e-6)
    other = "mean_std" if mode == "quantile" else "quantile"  # positive control: the other inverse differs
    assert not np.allclose(unnormalise(torch.from_numpy(y), stats, other).numpy(), want, atol=1e-2)


def test_gr00t_and_dreamzero_predict_from_tiny_runs(shards_rgb, shards_3cam, tmp_path, capsys):  # noqa: F811
    gr00t = train(CONFIGS / "gr00t_tiny.toml", shards_rgb, tmp_path / "gr00t", "data.val_episodes=[1,3]")
    code, body, err = predict(capsys, gr00t, shards_rgb, tmp_path / "p_gr00t", "--every", "3")
    assert code == 0, err
    assert ([e["episode_index"] for e in body["episodes"]], body["steps"], body["horizon"]) == ([1, 3], 4, 4)
    assert np.asarray(body["episodes"][0]["predicted"]).shape == (31, ROBOT_DIMS)
    dz = train(CONFIGS / "dreamzero_tiny.toml", shards_3cam, tmp_path / "dz", "train.micro_batch=2")
    code, body, err = predict(capsys, dz, shards_3cam, tmp_path / "p_dz", "--episodes", "1", "--batch-size", "4")
    assert code == 0, err
    assert (body["steps"], body["horizon"], body["trained_on"]) == (16, 8, [1])  # no holdout: it trained on all
    got = np.asarray(body["episodes"][0]["predicted"])
    assert got.shape == (34, 7) and np.isfinite(got).all() and (tmp_path / "p_dz" / "predict.png").is_file()


# --- LeRobot's sampler on the same weights, batch and noise -------------------------------------

@pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                    reason=f"no lerobot venv at {LEROBOT_PY.parents[1]}")
def test_the_pi05_sampler_equals_lerobots_sample_actions(
        pi05_run, shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    """predict's chunk equals LeRobot's `PI05Pytorch.sample_actions` on the run's export, for the
    batch predict built and its noise, and predict's actions are LeRobot's chunk unnormalised with
    its QUANTILES formula; LeRobot with 5 steps, or with the noise negated, differs (controls)."""
    from trainkit.cli import main

    captured = capture_samples(monkeypatch)
    code, body, _ = predict(capsys, pi05_run, shards_rgb, tmp_path / "p", "--batch-size", "1")
    assert code == 0 and len(captured["batch"]) == 1
    batch, chunk, noise = captured["batch"][0], captured["chunk"][0], captured["noise"][0]
    from trainkit.weights.export import load_run_model

    model, _, _ = load_run_model(pi05_run)
    full = family("pi05").sampler.sample(model.eval(), batch, noise, 10)  # every channel, padding too
    assert torch.equal(full[..., :ROBOT_DIMS].double(), chunk.double())
    export = tmp_path / "export"
    assert main(["export", str(pi05_run), str(export), "--format", "lerobot"]) == 0
    np.savez(tmp_path / "in.npz", images=batch.images.numpy(), image_mask=batch.image_mask.numpy(),
             tokens=batch.tokens.numpy(), token_mask=batch.token_mask.numpy(), noise=noise[0].numpy(),
             steps=np.array([10, 5]))
    done = subprocess.run([str(LEROBOT_PY), str(SAMPLE_ORACLE), str(export), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = dict(np.load(tmp_path / "out.npz"))
    scale, tol = np.abs(theirs["steps/10"]).max(), 2e-5  # the parity test's float32 tolerance
    assert np.abs(full.numpy() - theirs["steps/10"]).max() / scale < tol
    assert np.abs(full.numpy() - theirs["steps/5"]).max() / scale > 10 * tol  # controls: the step count
    assert np.abs(full.numpy() - theirs["negated"]).max() / scale > 0.1  # and the noise reach LeRobot
    q01, q99 = (np.asarray(body_stats) for body_stats in action_quantiles(shards_rgb))
    want = (theirs["steps/10"][0, :, :ROBOT_DIMS] + 1) / 2 * (q99 - q01) + q01  # LeRobot's unnormaliser, QUANTILES
    assert np.allclose(np.asarray(body["episodes"][0]["predicted"]), want[:17], rtol=1e-4, atol=1e-4)


def action_quantiles(shards: Path) -> tuple[list[float], list[float]]:
    from datakit.shards.index import load_index

    stats = load_index(shards).stats["action"]
    return stats["q01"], stats["q99"]

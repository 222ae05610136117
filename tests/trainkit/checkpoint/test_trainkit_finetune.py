"""The fine-tuning recipe (`trainkit/configs/pi05_finetune.toml`) and the checkpoint every run
leaves at its last step (issue 26, item 3).

- The recipe's values are openpi's Pi0.5 fine-tune defaults, and LeRobot 0.6.1's `PI05Config`
  where the two agree: the openpi values are transcribed from the files the TOML cites; LeRobot's
  are read from its own classes in the oracle venv (skipped without it).
- Its schedule is openpi's: compared step by step with a hand transcription of openpi's
  `CosineDecaySchedule` (optax's warmup_cosine_decay_schedule) and with LeRobot's built scheduler.
- Every run saves its last step (`output.save_last`, default true), also with
  `checkpoint_every = 0` and on SIGTERM, so `trainkit export` of any finished run has something
  to export; a rerun with more steps continues from it with the losses of an unbroken run.
  Trials (tune, ladder, bench) write none.
- The recipe runs as docs/fine-tuning.md says: run with init_from, then export as written.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainkit_fixtures import cli_run, shards_rgb, step_lines  # noqa: F401 - fixture
from trainkit_harness import ROOT, TINY

pytestmark = pytest.mark.timeout(240)

RECIPE = ROOT / "trainkit" / "configs" / "pi05_finetune.toml"
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason="no lerobot venv (make lerobot-oracle)")
# openpi (github.com/Physical-Intelligence/openpi @15a9616), transcribed by hand:
# src/openpi/training/optimizer.py CosineDecaySchedule() and AdamW() defaults, and
# src/openpi/training/config.py TrainConfig defaults (pi05_droid_finetune keeps all but the data,
# num_train_steps=20_000; pi05_aloha_pen_uncap the same with batch_size=64).
OPENPI = {"warmup_steps": 1_000, "peak_lr": 2.5e-5, "decay_steps": 30_000, "decay_lr": 2.5e-6,
          "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 1e-10, "clip_gradient_norm": 1.0,
          "ema_decay": 0.99, "batch_size": 32, "num_train_steps": 30_000, "save_interval": 1000, "seed": 42,
          "log_interval": 100}
# CPU-sized: the recipe's model at tiny widths, eager, fp32, two samples per step
CPU = ("model.preset=tiny", "parallel.compile=false", "parallel.param_dtype=float32", "optim.fused=false",
       "train.micro_batch=2", "train.global_batch=2", "data.num_workers=0", "output.progress=false",
       "output.log_every=1", "parallel.ac_stride={}", "parallel.group={}")


def _recipe(*overrides: str):
    from trainkit.config import load_config
    return load_config(RECIPE, list(overrides), required=False)


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _checkpoints(out: Path) -> list[str]:
    """The checkpoint folders of run `out` (not the `.hold` files export leaves beside them)."""
    return sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir()) if (out / "checkpoints").exists() else []


# --- the recipe's values ---------------------------------------------------------------------------
def test_the_recipe_is_openpis_pi05_fine_tune():
    cfg = _recipe()
    o, t = cfg.optim, cfg.train
    assert (cfg.model.family, cfg.model.preset) == ("pi05", "full")
    assert o.lr == OPENPI["peak_lr"] and o.warmup_steps == OPENPI["warmup_steps"] and o.schedule == "cosine"
    assert math.isclose(o.lr * o.min_lr_ratio, OPENPI["decay_lr"], rel_tol=1e-12)
    assert o.betas == [OPENPI["b1"], OPENPI["b2"]] and o.eps == OPENPI["eps"]
    assert o.weight_decay * o.lr * t.steps < 1e-9  # openpi's 1e-10: no shrinkage over the run either way
    assert t.grad_clip == OPENPI["clip_gradient_norm"] and t.ema_decay == OPENPI["ema_decay"]
    assert t.steps == OPENPI["num_train_steps"] == OPENPI["decay_steps"]  # the cosine ends at the last step
    assert t.global_batch == OPENPI["batch_size"] and t.seed == OPENPI["seed"]
    assert cfg.output.checkpoint_every == OPENPI["save_interval"] and cfg.output.log_every == OPENPI["log_interval"]
    assert cfg.output.save_last and cfg.output.keep_checkpoints >= 1
    assert cfg.data.norm == "quantile" and cfg.data.slots == []
    # the batch splits over 1, 2 and 4 GPUs (8: micro_batch 4, as the file says)
    assert all(t.global_batch % (t.micro_batch * w) == 0 for w in (1, 2, 4))


@needs_lerobot
def test_the_recipe_agrees_with_lerobots_pi05config_where_it_says():
    """LeRobot 0.6.1's own classes, read in its venv: every value the TOML calls "both" is LeRobot's;
    the ones it marks as openpi's differ from LeRobot's as stated (weight decay, EMA, steps, batch, save)."""
    code = ("import json; from lerobot.policies.pi05.configuration_pi05 import PI05Config as C; "
            "from lerobot.configs.train import TrainPipelineConfig as T; import dataclasses as d; "
            "c = C(); o = c.get_optimizer_preset(); s = c.get_scheduler_preset(); "
            "f = {x.name: x.default for x in d.fields(T)}; "
            "print(json.dumps(dict(lr=o.lr, betas=list(o.betas), eps=o.eps, wd=o.weight_decay, clip=o.grad_clip_norm, "
            "warmup=s.num_warmup_steps, decay_steps=s.num_decay_steps, peak=s.peak_lr, decay_lr=s.decay_lr, "
            "steps=f['steps'], batch=f['batch_size'], save_freq=f['save_freq'], save=f['save_checkpoint'], "
            "quantile=str(c.normalization_mapping['ACTION']))))")
    done = subprocess.run([str(LEROBOT_PY), "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    le = json.loads(done.stdout.strip().splitlines()[-1])
    cfg = _recipe()
    o, t = cfg.optim, cfg.train
    assert (o.lr, o.betas, o.eps, t.grad_clip, o.warmup_steps) == (le["lr"], le["betas"], le["eps"], le["clip"], le["warmup"])
    assert le["peak"] == o.lr and math.isclose(le["decay_lr"], o.lr * o.min_lr_ratio, rel_tol=1e-12)
    assert le["decay_steps"] == t.steps and "QUANTILE" in le["quantile"] and le["save"] is True
    # where the file takes openpi's
    assert (le["wd"], le["steps"], le["batch"], le["save_freq"]) == (0.01, 100_000, 8, 20_000)
    assert (o.weight_decay, t.steps, t.global_batch, cfg.output.checkpoint_every) != \
        (le["wd"], le["steps"], le["batch"], le["save_freq"])


# --- the schedule ----------------------------------------------------------------------------------
def _openpi_lr(step: int, *, warmup: int, peak: float, decay_steps: int, decay_lr: float) -> float:
    """openpi's CosineDecaySchedule.create(): optax.warmup_cosine_decay_schedule(init_value=peak /
    (warmup + 1), peak, warmup, decay_steps, end_value=decay_lr), written out (openpi's PyTorch
    trainer, scripts/train_pytorch.py lr_schedule, has the same formula)."""
    if step < warmup:
        init = peak / (warmup + 1)
        return init + (peak - init) * step / warmup
    done = min(step - warmup, decay_steps - warmup) / (decay_steps - warmup)
    return decay_lr + (peak - decay_lr) * 0.5 * (1 + math.cos(math.pi * done))


def _trainkit_lrs(cfg, steps: list[int]) -> list[float]:
    import torch

    from trainkit.optim.optimizer import build_optimizer, build_scheduler
    opt = build_optimizer(torch.nn.Linear(1, 1), cfg.optim, torch.device("cpu"))
    factor = build_scheduler(opt, cfg.optim, cfg.train.steps).lr_lambdas[0]
    return [cfg.optim.lr * factor(s) for s in steps]


SAMPLED = sorted({*range(1005), 1500, 5000, 10_000, 15_500, 17_405, 20_000, 29_998, 29_999, 30_000, 31_000})


def test_the_schedule_is_openpis_cosine_with_its_floor():
    cfg = _recipe()
    w, peak = cfg.optim.warmup_steps, cfg.optim.lr
    ref = [_openpi_lr(s, warmup=w, peak=peak, decay_steps=cfg.train.steps, decay_lr=2.5e-6) for s in SAMPLED]
    got = _trainkit_lrs(cfg, SAMPLED)
    for s, r, g in zip(SAMPLED, ref, got):
        if s < w:  # trainkit ramps as (s+1)/w, openpi as (s+1)/(w+1): the ratio is exact
            assert math.isclose(g / r, (w + 1) / w, rel_tol=1e-12), s
        else:
            assert math.isclose(g, r, rel_tol=1e-12, abs_tol=1e-20), (s, g, r)
    assert got[SAMPLED.index(w)] == peak and got[SAMPLED.index(30_000)] == pytest.approx(2.5e-6, rel=1e-12)
    assert got[-1] == pytest.approx(2.5e-6, rel=1e-12)  # beyond the last step: the floor, not a new cycle
    # a positive control: the reference tells a cosine that counts from step 0 (LeRobot's) apart
    shifted = cfg.optim.min_lr_ratio + (1 - cfg.optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * w / cfg.train.steps))
    assert not math.isclose(peak * shifted, ref[SAMPLED.index(w)], rel_tol=1e-4)


@needs_lerobot
def test_the_schedule_is_lerobots_but_for_where_its_cosine_starts():
    """LeRobot's CosineDecayWithWarmupSchedulerConfig, built by LeRobot: the same warm-up, a cosine
    counted from step 0 instead of from the warm-up's end: 0.25% below trainkit's (openpi's) peak at
    the warm-up's end, at most 4.6% below it mid-run (step ~17,400), the same floor at the last step."""
    code = ("import json, torch; from lerobot.policies.pi05.configuration_pi05 import PI05Config as C; "
            "s = C().get_scheduler_preset(); opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=s.peak_lr); "
            f"f = s.build(opt, 30000).lr_lambdas[0]; print(json.dumps([s.peak_lr * f(i) for i in {SAMPLED!r}]))")
    done = subprocess.run([str(LEROBOT_PY), "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lerobot = json.loads(done.stdout.strip().splitlines()[-1])
    cfg = _recipe()
    got = _trainkit_lrs(cfg, SAMPLED)
    w = cfg.optim.warmup_steps
    rel = {s: g / r - 1 for s, g, r in zip(SAMPLED, got, lerobot) if s >= w}
    assert 0.0024 < rel[w] < 0.0025 and 0.045 < rel[17_405] < 0.046 and abs(rel[30_000]) < 1e-12
    assert all(0 <= x < 0.046 for x in rel.values())
    assert all(math.isclose(g / r, (w + 1) / w, rel_tol=1e-9) for s, g, r in zip(SAMPLED, got, lerobot) if s < w)


# --- every run saves its last step ----------------------------------------------------------------
@pytest.mark.parametrize(("every", "save_last", "done", "stopping", "due"), [
    (0, True, 7, False, False), (0, True, 10, False, True), (0, True, 7, True, True),
    (0, False, 10, False, False), (0, False, 7, True, False),
    (5, False, 5, False, True), (5, False, 7, True, True), (5, False, 10, False, True), (5, False, 9, False, False),
    (4, True, 10, False, True), (4, True, 9, False, False),
])
def test_which_steps_are_saved(every, save_last, done, stopping, due):
    from trainkit.config import OutputConfig
    from trainkit.train import checkpoint_due
    out = OutputConfig(dir="x", checkpoint_every=every, save_last=save_last)
    assert checkpoint_due(out, done, 10, stopping=stopping) is due


def test_a_run_without_checkpoint_every_saves_its_last_step_exports_and_extends(shards_rgb, tmp_path, capsys):  # noqa: F811
    """pi05_tiny (checkpoint_every = 0): the run ends with step-000003, `trainkit export` writes it;
    a rerun with more steps continues from it with the losses of an unbroken 5-step run."""
    from trainkit.cli import main

    run, common = tmp_path / "run", (f"data.shards={shards_rgb}", "optim.schedule=constant", "output.log_every=1",
                                     "parallel.fsdp=none", "parallel.ac_stride={}")
    code, err = cli_run(capsys, *common, f"output.dir={run}", "train.steps=3")
    assert code == 0, err
    assert _checkpoints(run) == ["step-000003"]
    assert main(["export", str(run), str(tmp_path / "exp"), "--format", "lerobot"]) == 0, capsys.readouterr().err
    assert (tmp_path / "exp" / "model.safetensors").stat().st_size > 0
    # extended: resumes at step 3, and its step 3 and 4 are the unbroken run's
    code, err = cli_run(capsys, *common, f"output.dir={tmp_path / 'unbroken'}", "train.steps=5")
    assert code == 0, err
    code, err = cli_run(capsys, *common, f"output.dir={run}", "train.steps=5")
    assert code == 0 and "resuming" in err, err
    assert _checkpoints(run) == ["step-000003", "step-000005"]
    assert [x["loss"] for x in step_lines(run)] == [x["loss"] for x in step_lines(tmp_path / "unbroken")]
    # the same command again: one line, nothing trained, the finished run's files untouched
    before = {f: (run / f).read_bytes() for f in ("summary.json", "metrics.jsonl")}
    code, err = cli_run(capsys, *common, f"output.dir={run}", "train.steps=5")
    assert code == 0 and err == (f"trainkit: {run / 'checkpoints' / 'step-000005'} is step 5 of train.steps=5: "
                                 "nothing to train (raise train.steps to continue it, or use another output.dir "
                                 "for a new run)"), err
    assert {f: (run / f).read_bytes() for f in before} == before and _checkpoints(run)[-1] == "step-000005"
    # save_last = false: nothing at the end (the old behaviour, what trials run with)
    code, err = cli_run(capsys, *common, f"output.dir={tmp_path / 'nosave'}", "train.steps=2", "output.save_last=false")
    assert code == 0, err
    assert _checkpoints(tmp_path / "nosave") == []


def test_sigterm_without_checkpoint_every_saves_with_save_last(shards_rgb, tmp_path):  # noqa: F811
    from test_trainkit_run_hardening import _env, _wait_for_step

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainkit.cli", "run", str(TINY),
                             *_sets(f"data.shards={shards_rgb}", f"output.dir={out}", "output.progress=false",
                                    "output.log_every=1", "train.steps=1000", "parallel.fsdp=none",
                                    "data.num_workers=0")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for_step(out, proc, 1)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err
    last = step_lines(out)[-1]["step"]
    assert _checkpoints(out) == [f"step-{last + 1:06d}"] and f"step-{last + 1:06d} written" in err, err


def test_trials_write_no_final_checkpoint(shards_rgb, tmp_path):  # noqa: F811
    from trainkit.trials.run import Trial, run_trial

    trial = Trial(config=TINY, out_dir=tmp_path / "t", overrides=(f"data.shards={shards_rgb}", "data.num_workers=0",
                                                                  "train.steps=2", "parallel.fsdp=none"))
    assert trial.sets()[0] == "output.save_last=false"  # first: a caller's overrides may turn it on
    r = run_trial(trial)
    assert r.status == "ok", r.error
    assert _checkpoints(tmp_path / "t") == []


# --- the recipe, as docs/fine-tuning.md runs it -----------------------------------------------------
def test_the_recipe_fine_tunes_from_a_checkpoint_and_exports_as_documented(shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                          monkeypatch):
    """A checkpoint to start from (a tiny run, exported in LeRobot's layout), then the documented
    commands from a working directory: `trainkit run trainkit/configs/pi05_finetune.toml --set
    data.shards=OUT --set model.init_from=CKPT` (+ CPU sizes) and `trainkit export runs/pi05_finetune
    out/pi05_lerobot --format lerobot --weights ema`."""
    from trainkit.cli import main

    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'base'}", "train.steps=1",
                        "parallel.fsdp=none", "parallel.ac_stride={}")
    assert code == 0, err
    assert main(["export", str(tmp_path / "base"), str(tmp_path / "ckpt"), "--format", "lerobot"]) == 0
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trainkit").symlink_to(ROOT / "trainkit")  # the repository's relative config path
    assert main(["run", "trainkit/configs/pi05_finetune.toml", *_sets(f"data.shards={shards_rgb}",
                                                                       f"model.init_from={tmp_path / 'ckpt'}",
                                                                       "train.steps=2", *CPU)]) == 0
    err = capsys.readouterr().err
    assert f"model.init_from {tmp_path / 'ckpt'}: lerobot format" in err, err
    assert _checkpoints(tmp_path / "runs" / "pi05_finetune") == ["step-000002"]
    assert main(["export", "runs/pi05_finetune", "out/pi05_lerobot", "--format", "lerobot", "--weights", "ema"]) == 0
    assert (tmp_path / "out" / "pi05_lerobot" / "model.safetensors").is_file()


def test_the_memory_estimate_counts_the_weight_ema():
    """inspect's optimizer part grows by the EMA's own bytes (WeightEMA on a built tiny model is the oracle)."""
    import torch

    from trainkit.estimate.inspect import inspect_model
    from trainkit.models import build_model
    from trainkit.optim.ema import WeightEMA

    def optimizer_gib(ema: str) -> float:
        cfg = _recipe("model.preset=tiny", f"train.ema_decay={ema}")
        return inspect_model(cfg, world_size=1, gpu=("H200", 139.0))["memory"]["optimizer_gib"]

    model = build_model("pi05", "tiny", {})
    ema_bytes = sum(t.numel() * t.element_size() for t in WeightEMA(model, 0.99).shadow)
    assert all(t.dtype == torch.float32 for t in WeightEMA(model, 0.99).shadow)
    assert optimizer_gib("0.99") - optimizer_gib("0.0") == pytest.approx(ema_bytes / 2 ** 30, abs=2e-6)

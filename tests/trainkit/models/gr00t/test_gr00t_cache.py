"""GR00T's head trained from a cached backbone (`trainkit encode-backbone`, trainkit/predict/encode_backbone.py,
trainkit/models/gr00t/cache.py) against the full model on the CPU, tiny widths, fp32:

- the cache read back through the loader equals the model's own backbone forward (`vl_features`)
  on the trainer's batch of the same samples, bit for bit;
- one step's loss and every trained parameter's gradient from the cache equal the full model's
  (frozen backbone, N1.7's centre crop, every slot kept), bit for bit; so do 4 steps of `trainkit
  run` (the same samples and flow draws from the same seed: the cache keeps the loader's order);
- positive controls: a value flipped in the cache moves the loss; a cache of another seed's
  backbone or of another select_layer is refused in one line; a flipped byte is found by verify
  and the loader; random_crop, trained LLM layers and fixed_len off are refused;
- a kill -9 inside a shard or after a committed one, then a rerun: the bytes of an unbroken run.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from feature_faults import assert_damage_is_found, kill_after
from helpers import tree_bytes
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.cli import main
from trainkit.config import load_config
from trainkit.data import TrainData, read_run_shards
from trainkit.predict.encode_backbone import built_model, encode_backbone
from trainkit.errors import DataError, ModelConfigError
from trainkit.models import family
from trainkit.train import run
from trainkit_harness import ROOT

TINY = ROOT / "trainkit" / "configs" / "gr00t_tiny.toml"
# the cache's conditions (cache.py check_model_config); every slot kept, so the frame run's batches
# are the cache's samples (the fixture's blank camera is masked, not pruned); dropout on: its masks
# come from the same RNG state in both runs (the backbone draws none)
CACHED = ("model.lm_trained=0", "model.fixed_len=true", "model.dropout=0.1", "data.prune_slots=false")
COMMON = ("output.progress=false", "data.num_workers=0", "train.steps=4", "train.micro_batch=2", "optim.lr=1e-2",
          "optim.warmup_steps=0", "optim.schedule=constant", "output.log_every=1", "parallel.fsdp=none")


def config(shards, out, *sets):
    return load_config(TINY, [f"data.shards={shards}", f"output.dir={out}", *COMMON, *CACHED, *sets])


@pytest.fixture(scope="module")
def cache(shards_rgb, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("gr00t_cache") / "features"
    encode_backbone(config(shards_rgb, out.parent / "unused"), out, batch=4, progress=False)
    return out


def first_batch(cfg):
    fam = family("gr00t")
    shards = read_run_shards(cfg.data, 3)
    model_cfg = built_model(cfg, torch.device("cpu")).cfg
    data = TrainData(cfg.data, shards, fam, model_cfg, seed=cfg.train.seed, rank=0, world_size=1, micro_batch=4,
                     device=torch.device("cpu"), image_dtype=torch.float32)
    return data, next(data.batches())


def test_cache_equals_the_backbone_and_the_head_step_equals_the_full_model(shards_rgb, cache, tmp_path):  # noqa: F811
    cfg_f, cfg_c = config(shards_rgb, tmp_path / "f"), config(cache, tmp_path / "c")
    _, frames = first_batch(cfg_f)
    data_c, cached = first_batch(cfg_c)
    data_c.adapter.check(built_model(cfg_c, torch.device("cpu")), torch.float32)  # the run's weights are the cache's
    assert torch.equal(frames.rows, cached.rows) and cached.slots == 3
    model = built_model(cfg_f, torch.device("cpu")).train()
    vl, image, valid, seen = model.vl_features(frames.model)
    c = cached.model
    assert vl.dtype == c.vl.dtype == torch.float32
    for mine, theirs in ((vl, c.vl), (image, c.vl_image), (valid, c.valid), (seen, c.seen)):
        assert torch.equal(mine, theirs)

    def step(batch):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)  # the dropout masks
        loss = model(batch)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    loss_f, grads_f = step(frames.model)
    loss_c, grads_c = step(c)
    assert torch.equal(loss_f, loss_c)
    assert grads_f.keys() == grads_c.keys() and len(grads_f) > 10
    assert all(torch.equal(grads_f[n], grads_c[n]) for n in grads_f)
    # positive control: one value of one valid token moved
    k = int(torch.nonzero(c.valid[0])[0, 0])
    flipped = c.vl.clone()
    flipped[0, k, 0] += 1.0
    loss_x, _ = step(dataclasses.replace(c, vl=flipped))
    assert not torch.equal(loss_x, loss_c)


def test_trained_from_the_cache_the_losses_are_the_frame_runs(shards_rgb, cache, tmp_path):  # noqa: F811
    frames = run(config(shards_rgb, tmp_path / "f")).losses
    cached = run(config(cache, tmp_path / "c")).losses
    assert len(frames) == 4 and cached == frames


def _evals(out: Path) -> list[tuple[int, float]]:
    import json

    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["val_loss"]) for r in recs if r.get("kind") == "eval"]


def test_a_holdout_from_the_cache_validates_as_the_frame_run(shards_rgb, cache, tmp_path):  # noqa: F811
    """data.val_fraction on a cache holds out the episodes it holds out on the frames: the training
    losses and the validation losses equal the frame run's bit for bit. Control: another holdout
    (other episodes) gives other validation losses, so the equality is not a given."""
    sets = ("data.val_fraction=0.25", "train.eval_every=2", "train.eval_batches=2")
    frames = run(config(shards_rgb, tmp_path / "f", *sets)).losses
    cached = run(config(cache, tmp_path / "c", *sets)).losses
    assert cached == frames
    got, want = _evals(tmp_path / "c"), _evals(tmp_path / "f")
    assert len(want) == 2 and got == want
    other = ("data.val_episodes=[0]", "train.eval_every=2", "train.eval_batches=2")
    run(config(cache, tmp_path / "o", *other))
    assert [v for _, v in _evals(tmp_path / "o")] != [v for _, v in want]


@pytest.mark.parametrize("sets, match", [(("train.seed=1",), "other backbone weights"),
                                         (("model.lm_depth=3",), "another model .select_layer: 4 before, 3 now"),
                                         (("model.random_crop=true",), "augmentation"),
                                         (("model.lm_trained=1",), "lm_trained = 1"),
                                         (("parallel.param_dtype=bfloat16",), "the run computes in bfloat16")])
def test_a_cache_that_is_not_this_models_backbone_is_refused(cache, tmp_path, sets, match):
    with pytest.raises((DataError, ModelConfigError), match=match) as e:
        run(config(cache, tmp_path / "r", *sets))
    assert "\n" not in str(e.value)


def test_a_flipped_byte_is_found_by_verify_and_the_loader(cache, tmp_path):
    assert_damage_is_found(cache, tmp_path)  # the flipped byte lands inside the first sample's vl


def test_cli_resumes_refuses_in_one_line_and_says_a_summary(shards_rgb, cache, tmp_path, capsys):  # noqa: F811
    sets = [a for s in (f"data.shards={shards_rgb}", *CACHED) for a in ("--set", s)]
    out = tmp_path / "f"
    assert main(["encode-backbone", str(TINY), "--out", str(out), "--batch", "4", "--no-progress", *sets]) == 0
    said = capsys.readouterr().out
    assert "81 samples" in said and "64 features each" in said
    assert tree_bytes(out) == tree_bytes(cache)
    assert main(["encode-backbone", str(TINY), "--out", str(out), "--batch", "4", "--no-progress", *sets]) == 0
    assert "already complete" in capsys.readouterr().out
    for args, match in ((["--set", "model.random_crop=true"], "augmentation"),
                        (["--set", "model.fixed_len=false"], "fixed_len = true"),
                        (["--set", "model.fixed_len=false", "--set", "model.lm_trained=1"],  # both, in one line
                         "set model.lm_trained = 0; each sample's padded sequence"),
                        (["--set", f"data.shards={tmp_path / 'none'}"], "none"),
                        (["--set", f"data.shards={cache}"], "feature folder already"),
                        (["--batch", "2"], "batch: 4 before, 2 now")):
        assert main(["encode-backbone", str(TINY), "--out", str(out), "--no-progress", *sets, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err
    pi05 = ROOT / "trainkit" / "configs" / "pi05_tiny.toml"
    assert main(["encode-backbone", str(pi05), "--out", str(tmp_path / "g"), "--set", f"data.shards={shards_rgb}"]) == 2
    assert "no frozen backbone" in capsys.readouterr().err


def _killed_run(cfg, out: Path, point: str, n: int) -> None:
    """In the child: arm the kill at the n-th `point`, then encode."""
    import datakit.encode.shard as shard
    import trainkit.predict.encode_backbone as driver

    if point == "tensor":  # a shard half-written (.tar.tmp)
        shard.FeatureWriter.tensor = kill_after(shard.FeatureWriter.tensor, n)
    else:  # "commit": a shard committed and journaled, the next not started
        driver.commit_shard = kill_after(driver.commit_shard, n)
    encode_backbone(cfg, out, batch=4, progress=False)
    os._exit(0)


# 3 tensors a sample, shards of 24, 31, 17, 9 samples: the 100th tensor is inside the second shard
@pytest.mark.parametrize("point, n, kept", [("tensor", 100, 1), ("commit", 2, 2)])
def test_kill9_then_rerun_gives_identical_bytes(shards_rgb, cache, tmp_path, point, n, kept):  # noqa: F811
    cfg, out = config(shards_rgb, tmp_path / "unused"), tmp_path / "out"
    child = mp.get_context("fork").Process(target=_killed_run, args=(cfg, out, point, n))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, f"the encode finished before reaching {point}"
    assert not (out / "checksums.json").exists()  # nothing that looks finished
    s = encode_backbone(cfg, out, batch=4, progress=False)
    assert s.resumed_shards == kept and s.samples_encoded == 81 - (24, 55)[kept - 1]
    assert tree_bytes(out) == tree_bytes(cache)


def _terminated_cli(shards, out: Path, err: Path, signum: int) -> None:
    """In the child: send `signum` to itself after the first committed shard, inside `trainkit
    encode-backbone`; exit with the CLI's code, its stderr in `err`."""
    import trainkit.predict.encode_backbone as driver

    real = driver.commit_shard

    def commit_then_signal(*a, **kw):
        r = real(*a, **kw)
        os.kill(os.getpid(), signum)
        return r

    driver.commit_shard = commit_then_signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever started pytest
    fd = os.open(err, os.O_WRONLY | os.O_CREAT)
    os.dup2(fd, 2)
    sys.stderr = open(2, "w", closefd=False)
    sets = [a for s in (f"data.shards={shards}", *CACHED) for a in ("--set", s)]
    rc = main(["encode-backbone", str(TINY), "--out", str(out), "--batch", "4", "--no-progress", *sets])
    sys.stderr.flush()
    os._exit(rc)


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                 (signal.SIGINT, 130, "interrupted by Ctrl-C (SIGINT)")])
def test_sigterm_and_ctrl_c_are_one_line_and_a_rerun_resumes(shards_rgb, cache, tmp_path, signum, code, said):  # noqa: F811
    out, err = tmp_path / "out", tmp_path / "err"
    child = mp.get_context("fork").Process(target=_terminated_cli, args=(shards_rgb, out, err, signum))
    child.start()
    child.join(120)
    lines = err.read_text().strip().splitlines()
    assert child.exitcode == code, lines
    assert len(lines) == 1 and said in lines[0] and "rerun the same command to resume" in lines[0], lines
    s = encode_backbone(config(shards_rgb, tmp_path / "unused"), out, batch=4, progress=False)
    assert s.resumed_shards == 1 and tree_bytes(out) == tree_bytes(cache)


def test_inspect_reports_the_cache_and_refuses_a_loader_toml_in_one_line(cache, tmp_path, capsys):
    """`trainkit inspect` on a cache: its samples, fields and bytes a sample (the cached tensors plus the
    float32 state and actions of frames.arrow) in place of a LoaderConfig it does not have; asking to
    write one is a one-line refusal, exit 2."""
    import json

    from datakit.shards.features import load_features

    index = load_features(cache)
    sets = [a for s in (f"data.shards={cache}", *CACHED) for a in ("--set", s)]
    assert main(["inspect", str(TINY), *sets, "--json"]) == 0
    loader = json.loads(capsys.readouterr().out)["loader"]
    assert (loader["features"], loader["kind"], loader["clips"]) == (str(cache), "backbone", 81)
    assert set(loader["fields"]) == set(index.fields) >= {"vl", "vl_masks"}
    want = sum(f.bytes for f in index.fields.values()) + 4 * (len(index.state_names) + index.span * len(index.action_names))
    assert loader["bytes_per_sample"] == want
    assert main(["inspect", str(TINY), *sets, "--loader-toml", str(tmp_path / "l.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a feature folder" in err and not (tmp_path / "l.toml").exists()

"""The `dreamzero` family against independent oracles:

- the block-causal mask: a dense reference built here token by token from the rule the issue
  states (from the token's part, block and kind, computed here from the config's shapes), against
  the sequence's pattern; the "blocks" kernel (one SDPA per part) against naive float64 softmax
  attention under that reference mask (and FlexAttention too, on CUDA);
- the FLOP count: torch.utils.flop_counter over a tiny forward + backward;
- training through `trainkit run` on shards converted from a generated 3-camera dataset (PNG
  image columns, tiled into one canvas by the loader): the loss goes down; `baseline` and
  `optimised` (the switches that run on CPU) give the same losses; a resumed run gives the losses
  of the unbroken one.
"""
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from trainkit.config import load_config
from trainkit.models import build_model
from trainkit.models.dreamzero import PRESETS, DreamZeroBatch, TokenSequence, flops_per_sample
from trainkit.models.dreamzero.attention import block_causal_attention

CONFIGS = Path(__file__).resolve().parents[4] / "trainkit" / "configs"


def reference_mask(cfg) -> torch.Tensor:
    """(T, T) bool from the rule, token by token: tokens are listed as (part, block, kind) in sequence
    order (clean frame 0, clean blocks 1..n, noisy frame 0, then per block its noisy frames, actions,
    states)."""
    tpf, fpb, n = cfg.tokens_per_frame, cfg.frames_per_block, cfg.blocks
    tokens = [("clean", 0, "video")] * tpf
    for i in range(1, n + 1):
        tokens += [("clean", i, "video")] * (fpb * tpf)
    tokens += [("noisy", 0, "video")] * tpf
    for i in range(1, n + 1):
        tokens += [("noisy", i, "video")] * (fpb * tpf) + [("noisy", i, "action")] * cfg.actions_per_block
        tokens += [("noisy", i, "state")] * cfg.states_per_block
    t = len(tokens)
    mask = torch.zeros(t, t, dtype=torch.bool)
    for qi, (qpart, qb, qkind) in enumerate(tokens):
        for ki, (kpart, kb, kkind) in enumerate(tokens):
            if qpart == "clean":
                mask[qi, ki] = kpart == "clean" and kb <= qb
            elif qkind == "state" or qb == 0:  # states and the noisy conditioning frame: themselves
                mask[qi, ki] = kpart == "noisy" and kb == qb and (kkind == "state") == (qkind == "state")
            else:  # noisy video and action tokens of block qb
                mask[qi, ki] = (kpart == "clean" and kb < qb) or (kpart == "noisy" and kb == qb)
    return mask


@pytest.mark.parametrize("preset", ["tiny", "5b"])
def test_block_causal_pattern_equals_the_reference_mask(preset):
    cfg = PRESETS[preset]()
    seq = TokenSequence.of(cfg)
    if preset == "5b":  # 4,060 tokens: the counts, not the whole reference
        assert seq.total == 2 * 9 * 220 + 96 + 4
    dense = seq.dense_mask()
    if preset == "tiny":
        assert torch.equal(dense, reference_mask(cfg))
    assert seq.attended_pairs == int(dense.sum())
    # each token's row is covered by exactly one call, and the calls' key spans do not overlap
    covered = torch.zeros(seq.total, dtype=torch.int64)
    for (q0, q1), keys in seq.calls:
        covered[q0:q1] += 1
        assert all(a[1] <= b[0] for a, b in zip(keys, keys[1:]))
    assert bool((covered == 1).all())
    if preset == "tiny":
        from trainkit.models.dreamzero.attention import flex_mask_mod
        idx = torch.arange(seq.total)
        assert torch.equal(flex_mask_mod(seq, "cpu")(0, 0, idx[:, None], idx[None, :]), dense)


def naive_attention(q, k, v, mask):
    """softmax(QK^T / sqrt(d) masked) V in float64; token-major (B, T, H, hd) in, (B, T, H*hd) out."""
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    p = s.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.double())
    return out.reshape(q.shape[0], q.shape[1], -1)


@pytest.mark.parametrize("kernel", ["blocks", "dense", "flex"])
def test_attention_kernels_equal_dense_masked_attention(kernel):
    if kernel == "flex" and not torch.cuda.is_available():
        pytest.skip("FlexAttention is measured on CUDA only")
    cfg = PRESETS["tiny"]()
    device = "cuda" if kernel == "flex" else "cpu"
    dtype = torch.float32 if kernel == "flex" else torch.float64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, TokenSequence.of(cfg).total, cfg.heads, cfg.head_dim, generator=g, dtype=dtype).to(device)
               for _ in range(3))
    got = block_causal_attention(q, k, v, TokenSequence.of(cfg), kernel)
    want = naive_attention(q.cpu(), k.cpu(), v.cpu(), reference_mask(cfg))
    tol = 1e-5 if kernel == "flex" else 1e-12
    torch.testing.assert_close(got.cpu().double(), want, atol=tol, rtol=tol)


def test_rope_positions_follow_the_tokens():
    """Wan's head-dim split (d - 4 floor(d/6), 2 floor(d/6), 2 floor(d/6)); a noisy frame's angles are
    its clean copy's; actions and states count on over the blocks (the per-block offsets)."""
    from trainkit.models.dreamzero.rope import rope_angles, video_split

    assert video_split(128) == (44, 42, 42) and video_split(16) == (8, 4, 4)
    cfg = PRESETS["tiny"]()
    seq = TokenSequence.of(cfg)
    a = rope_angles(seq, cfg.grid, cfg.head_dim, cfg.rope_theta)
    tpf, c = cfg.tokens_per_frame, seq.clean
    assert torch.equal(a[c:c + tpf], a[:tpf])  # noisy frame 0 = clean frame 0
    g0, _ = seq.group_span(2)
    assert torch.equal(a[g0:g0 + seq.block_video], a[seq.clean_end(1):seq.clean_end(2)])
    act = a[seq.action_index()]
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    assert torch.allclose(act, torch.arange(cfg.horizon, dtype=torch.float64)[:, None] * inv)


def test_rope_tables_are_built_once_per_sequence(monkeypatch):
    """The second call of a sequence returns the first call's tensors without building them again (a
    CUDA graph's capture refuses the host tables' copy: issue 41's lora_plain_graphs crash); another
    sequence builds its own."""
    from trainkit.models.dreamzero import rope

    cfg = PRESETS["tiny"]()
    seq = TokenSequence.of(cfg)
    rope._rope_tables.cache_clear()
    cos, sin = rope.rope_tables(seq, cfg.grid, cfg.head_dim, cfg.rope_theta, torch.device("cpu"))
    a = rope.rope_angles(seq, cfg.grid, cfg.head_dim, cfg.rope_theta)
    assert torch.equal(cos, a.cos().float()) and torch.equal(sin, a.sin().float())

    def built_again(*args):
        raise AssertionError("rope tables built again")

    monkeypatch.setattr(rope, "rope_angles", built_again)
    again = rope.rope_tables(seq, cfg.grid, cfg.head_dim, cfg.rope_theta, torch.device("cpu"))
    assert again[0] is cos and again[1] is sin
    with pytest.raises(AssertionError, match="built again"):  # positive control: a new sequence builds
        rope.rope_tables(dataclasses.replace(seq, blocks=seq.blocks + 1), cfg.grid, cfg.head_dim,
                         cfg.rope_theta, torch.device("cpu"))


def test_schedule_is_dreamzeros():
    """shift 5 over 1000 steps: sigma(0) = 1, sigma(999) = 5 s / (1 + 4 s) at s = 1/1000; the weights
    have mean 1 and peak at the middle timestep; a block's frames share the id of its first."""
    from trainkit.models.dreamzero import schedule

    s = schedule.sigmas(1000, 5.0)
    assert s[0] == 1.0 and s[-1] == pytest.approx(5e-3 / (1 + 4e-3))
    w = schedule.weights(1000, 5.0)
    assert w.mean() == pytest.approx(1.0) and w.min() == 0.0
    t = schedule.timesteps(1000, 5.0)
    assert abs(float(t[int(w.argmax())]) - 500) < 2
    ids = schedule.block_ids(torch.tensor([[9, 1, 2, 3, 4]]), 2)
    assert ids.tolist() == [[9, 1, 1, 3, 3]]


def tiny_batch(cfg, b: int) -> DreamZeroBatch:
    from trainkit.models.dreamzero.batches import flow_extras

    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    h, w = cfg.latent_hw
    f = cfg.latent_frames
    return DreamZeroBatch(latents=r(b, cfg.latent_channels, f, h, w), cond=r(b, 4 + cfg.latent_channels, f, h, w)
                          if cfg.first_frame_concat else torch.zeros(b, 0, f, h, w),
                          text=r(b, cfg.text_len, cfg.text_width), image=r(b, cfg.image_tokens, cfg.image_width),
                          state=r(b, cfg.state_tokens, cfg.state_dim), actions=r(b, cfg.horizon, cfg.action_dim),
                          action_mask=(torch.rand(b, cfg.horizon, cfg.action_dim, generator=g) > 0.2).float(),
                          **flow_extras(cfg, b, g))


def test_flops_per_sample_matches_flop_counter():
    """The math SDPA backend decomposes attention into bmm, which the counter sees. Every float input
    of the batch requires grad, so each matmul gets its full backward (3x), as the count assumes."""
    cfg, b = PRESETS["tiny"](), 2
    torch.manual_seed(0)
    model, batch = build_model("dreamzero", "tiny"), tiny_batch(cfg, 2)
    for name in ("latents", "text", "image", "state", "actions", "noise", "action_noise", "sigma"):
        getattr(batch, name).requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).backward()
    assert counter.get_total_flops() == b * flops_per_sample(cfg)


def test_presets_are_the_stated_shapes():
    """5b: Wan2.2-TI2V-5B's DiT plus the I2V image K/V and the action/state MLPs; 14b: Wan2.1-I2V-14B's
    (input 36 = 16 + 4 + 16 channels); a third of full attention's pairs at the 5b shapes."""
    cfg = PRESETS["5b"]()
    counts = {}
    for preset in ("5b", "14b"):
        with torch.device("meta"):
            counts[preset] = sum(p.numel() for p in build_model("dreamzero", preset).parameters() if p.requires_grad)
    assert 5.5e9 < counts["5b"] < 5.7e9 and 16.3e9 < counts["14b"] < 16.6e9
    assert (cfg.latent_frames, cfg.tokens_per_frame, cfg.horizon, cfg.in_dim) == (9, 220, 96, 48)
    c14 = PRESETS["14b"]()
    assert (c14.tokens_per_frame, c14.in_dim, c14.latent_channels) == (880, 36, 16)
    assert TokenSequence.of(cfg).attended_pairs / TokenSequence.of(cfg).total ** 2 == pytest.approx(0.298, abs=1e-3)


def test_loss_is_the_weighted_flow_matching_loss():
    """The loss written out here from the velocities: per-frame video MSE x the frame's weight, plus the
    masked action MSE x its block's weight; the masked-out action channels do not count."""
    torch.manual_seed(0)
    model = build_model("dreamzero", "tiny")
    cfg = model.cfg
    with torch.no_grad():
        model.head.head.weight.normal_(std=0.1)
    batch = tiny_batch(cfg, 2)
    pv, pa, x0 = model.velocities(batch)
    target = model.patchify(batch.noise) - x0
    video = sum(((pv[i, f] - target[i, f]) ** 2).mean() * batch.weight[i, f]
                for i in range(2) for f in range(cfg.latent_frames)) / (2 * cfg.latent_frames)
    action = 0.0
    for i in range(2):
        for j in range(cfg.horizon):
            err = (pa[i, j] - (batch.action_noise[i, j] - batch.actions[i, j])) ** 2 * batch.action_mask[i, j]
            action = action + err.mean() * batch.weight[i, 1 + (j // cfg.actions_per_block) * cfg.frames_per_block]
    want = video + action / (2 * cfg.horizon)
    assert torch.allclose(model(batch), want, rtol=1e-5)
    unmasked = dataclasses.replace(batch, action_mask=torch.ones_like(batch.action_mask))
    assert not torch.allclose(model(unmasked), want, rtol=1e-3)  # the mask takes terms out


# --- training through trainkit run --------------------------------------------------------------------
STEPS = 24
# baseline vs optimised: the same float32 math in other orders (recompute, one vs per-block FSDP
# units, fused vs foreach AdamW, host vs device normalisation). Measured max |diff| over 20 steps:
# 4.8e-7 (torch 2.11 CPU, one thread); the tolerance leaves 20x room for other BLAS builds.
BASELINE = ("parallel.fsdp=root", "parallel.prefetch=false", "parallel.ac_stride={blocks = 1}",
            "data.h2d_dtype=float32", "optim.fused=false")
OPTIMISED = ("parallel.fsdp=block", "parallel.prefetch=true", "parallel.ac_stride={}", "data.h2d_dtype=uint8",
             "optim.fused=true")
LOSS_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(shards_3cam, tmp_path_factory):  # noqa: F811
    from trainkit.train import run

    tmp = tmp_path_factory.mktemp("dreamzero_runs")
    common = [f"data.shards={shards_3cam}", "output.progress=false", f"train.steps={STEPS}", "optim.schedule=constant",
              "optim.warmup_steps=0", "output.log_every=12"]

    def cfg(name, *sets):
        return load_config(CONFIGS / "dreamzero_tiny.toml", [*common, f"output.dir={tmp / name}", *sets])

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {"baseline": run(cfg("baseline", *BASELINE, "train.steps=20")), "optimised": run(cfg("optimised", *OPTIMISED))}
        out["first"] = run(cfg("resumed", *OPTIMISED, "train.steps=12", "output.checkpoint_every=12"))
        out["second"] = run(cfg("resumed", *OPTIMISED))
    finally:
        torch.set_num_threads(threads)
    return out


def test_tiny_trains_and_the_loss_goes_down(runs):
    losses = [runs["optimised"].losses[s] for s in range(STEPS)]
    assert all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert last < 0.95 * first, (first, last)  # measured: 3.11 -> 2.80 (weighted flow-matching losses are noisy)
    assert runs["optimised"].summary["family"] == "dreamzero"


def test_baseline_and_optimised_give_the_same_losses(runs):
    base, opt = runs["baseline"], runs["optimised"]
    diff = max(abs(base.losses[s] - opt.losses[s]) for s in range(20))
    assert diff < LOSS_TOL, diff
    assert base.plan.applied == ["activation_checkpointing", "fsdp_root"]
    assert opt.plan.applied == ["fsdp_block", "prefetch"]


def test_resume_gives_the_losses_of_the_unbroken_run(runs):
    unbroken, first, second = runs["optimised"], runs["first"], runs["second"]
    assert second.start_step == 12
    assert [first.losses[s] for s in range(12)] == [unbroken.losses[s] for s in range(12)]
    assert [second.losses[s] for s in range(12, STEPS)] == [unbroken.losses[s] for s in range(12, STEPS)]


def test_configs_and_inspect_of_the_5b_and_14b_presets():
    """The shipped 5b configs are what their comments say: the optimised one fits one H200 with
    headroom by inspect's estimate (at least 10% of the GPU left); and `trainkit inspect` reports 14b
    at 1, 2 and 8 GPUs: fp32 weights (4 bytes per parameter) and AdamW's two states (8 per trainable
    one), sharded over the GPUs, so 184 GiB before any activation at one GPU: it cannot train there
    (micro-batch 1, every block recomputed), and says the smallest GPU count that fits it."""
    from trainkit.estimate.inspect import inspect_model

    base = inspect_model(load_config(CONFIGS / "dreamzero_5b_baseline.toml", required=False))
    opt = inspect_model(load_config(CONFIGS / "dreamzero_5b_optimised.toml", required=False))
    assert base["micro_batch"] == 1 and base["fsdp"]["units"] == 1 and len(base["recompute"]["blocks"]) == 30
    assert opt["fsdp"]["block_units"] == 30 and opt["recompute"]["blocks"] == []
    assert base["flops_per_sample"]["3"] == opt["flops_per_sample"]["3"] == flops_per_sample(PRESETS["5b"]())
    m = opt["memory"]
    assert m["fits"] and m["peak_gib"] < 0.9 * m["gpu_memory_gib"], m
    sets = ["model.preset=14b", "train.micro_batch=1", "train.global_batch=0", "parallel.ac_stride={blocks = 1}"]
    reports = {w: inspect_model(load_config(CONFIGS / "dreamzero_5b_optimised.toml", sets, required=False), world_size=w)
               for w in (1, 2, 8)}
    trainable = reports[1]["params"]["trainable"]
    assert 16.3e9 < trainable < 16.6e9
    for w, r in reports.items():
        m = r["memory"]
        assert m["params_gib"] + m["optimizer_gib"] == pytest.approx(12 * trainable / w / 2 ** 30, rel=1e-3)
    assert not reports[1]["memory"]["fits"] and reports[2]["memory"]["fits"] and reports[8]["memory"]["fits"]
    assert reports[1]["memory"]["fits_from_world_size"] == 2


def test_tune_searches_the_optimised_config_under_a_memory_cap():
    """`trainkit tune --memory-cap` on the shipped 5b config: the config's own setting fits a 125 GiB
    cap, micro-batch 4 without recompute does not, and recomputing every other block brings it under."""
    from trainkit.trials.tune import Space, candidates

    # the micro-batch the preset chooses on an H200 (train.micro_batch = "auto"), without its global batch's limit
    cfg = load_config(CONFIGS / "dreamzero_5b_optimised.toml", ["train.micro_batch=2", "train.global_batch=0"],
                      required=False)
    pool = {(c.setting.micro_batch, dict(c.setting.ac_stride)["blocks"], c.setting.compile): c.peak(1.0)
            for c in candidates(cfg, Space(micro_batches=(2, 4), strides=(0, 2), groups=(1,), compile=(True,)), 1)}
    assert pool[(2, 0, True)] < 125 < pool[(4, 0, True)]
    assert pool[(4, 2, True)] < 125


def test_feature_batches_normalise_and_pad_as_wan():
    """From a feature folder: latents (and the first-frame conditioning latents) as (z - mean) / std
    of the folder's VAE record, Wan2.1's mask channels on latent frame 0; text zeroed past each
    prompt and zero-padded to text_len; the clip's first state on every state token."""
    from types import SimpleNamespace

    from trainkit.models.dreamzero.batches import DreamZeroFeatureBatches, check_features

    cfg = dataclasses.replace(PRESETS["tiny"](), first_frame_concat=True)
    c, f, (h, w) = cfg.latent_channels, cfg.latent_frames, cfg.latent_hw
    mean, std = torch.arange(c, dtype=torch.float32), torch.arange(1, c + 1, dtype=torch.float32)
    index = SimpleNamespace(fingerprint={"frames": cfg.frames, "size": list(cfg.canvas), "tile": "wrist_top"},
                            span=cfg.horizon,
                            fields={"latents": SimpleNamespace(shape=(c, f, h, w)),
                                    "cond_latents": SimpleNamespace(shape=(c, f - 1, h, w))},
                            vae={"latents_mean": mean.tolist(), "latents_std": std.tolist()}, text_width=cfg.text_width)
    adapter = DreamZeroFeatureBatches(cfg, index, "feat")
    g = torch.Generator().manual_seed(0)
    hb = {"latents": torch.randn(2, c, f, h, w, generator=g), "cond_latents": torch.randn(2, c, f - 1, h, w, generator=g),
          "text": torch.randn(2, 5, cfg.text_width, generator=g), "text_mask": torch.tensor([[1] * 5, [1] * 3 + [0] * 2]).bool(),
          "state": torch.randn(2, 6, generator=g), "action": torch.randn(2, cfg.horizon + 3, 7, generator=g)}
    b = adapter.model_batch(adapter.extras(hb, g))
    norm = lambda z: (z - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1)  # noqa: E731
    torch.testing.assert_close(b.latents, norm(hb["latents"]))
    assert b.cond.shape == (2, 4 + c, f, h, w) and bool((b.cond[:, :4, 0] == 1).all()) and not b.cond[:, :4, 1:].any()
    torch.testing.assert_close(b.cond[:, 4:, 1:], norm(hb["cond_latents"]))
    torch.testing.assert_close(b.cond[:, 4:, :1], b.latents[:, :, :1])
    assert b.text.shape == (2, cfg.text_len, cfg.text_width) and not b.text[1, 3:].any() and not b.text[0, 5:].any()
    torch.testing.assert_close(b.text[0, :5], hb["text"][0])
    assert torch.equal(b.state[:, 0, :6], hb["state"]) and torch.equal(b.state[:, -1], b.state[:, 0])
    assert b.actions.shape == (2, cfg.horizon, cfg.action_dim) and bool((b.action_mask[..., 7:] == 0).all())
    with pytest.raises(Exception, match="first-frame conditioning"):  # a Wan2.2 folder for a Wan2.1-I2V model
        check_features(cfg, SimpleNamespace(**{**vars(index), "fields": {"latents": index.fields["latents"]}}), "feat")

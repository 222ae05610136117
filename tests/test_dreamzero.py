"""The `dreamzero` family against independent oracles:

- the block-causal mask: a dense reference built here token by token from the rule the issue
  states (from the token's part and block, computed here from the config's shapes), against the
  sequence's pattern; the "blocks" kernel (one SDPA per part) against naive float64 softmax
  attention under that reference mask (and FlexAttention too, on CUDA);
- the FLOP count: torch.utils.flop_counter over a tiny forward + backward;
- training through `trainkit run` on shards converted from a generated 3-camera dataset (PNG
  image columns, tiled into one canvas by the loader): the loss goes down; `baseline` and
  `optimised` (the switches that run on CPU) give the same losses; a resumed run gives the losses
  of the unbroken one.
"""
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

CONFIGS = Path(__file__).resolve().parents[1] / "trainkit" / "configs"


def reference_mask(cfg) -> torch.Tensor:
    """(T, T) bool from the rule, token by token: tokens are listed as (part, block) in sequence
    order (clean 0 = frame 0 + state; clean 1..n; then per block its noisy frames and actions)."""
    tpf, fpb, n = cfg.tokens_per_frame, cfg.frames_per_block, cfg.blocks
    tokens = [("clean", 0)] * (tpf + cfg.state_tokens)
    for i in range(1, n + 1):
        tokens += [("clean", i)] * (fpb * tpf)
    for i in range(1, n + 1):
        tokens += [("noisy", i)] * (fpb * tpf + cfg.actions_per_block)
    t = len(tokens)
    mask = torch.zeros(t, t, dtype=torch.bool)
    for qi, (qpart, qb) in enumerate(tokens):
        for ki, (kpart, kb) in enumerate(tokens):
            if qpart == "clean":
                mask[qi, ki] = kpart == "clean" and kb <= qb
            else:  # noisy video and action tokens of block qb
                mask[qi, ki] = (kpart == "clean" and kb < qb) or (kpart == "noisy" and kb == qb)
    return mask


@pytest.mark.parametrize("preset", ["tiny", "5b"])
def test_block_causal_pattern_equals_the_reference_mask(preset):
    cfg = PRESETS[preset]()
    seq = TokenSequence.of(cfg)
    if preset == "5b":  # 3,840 tokens: the rule checked on the part boundaries' rows is enough
        assert seq.total == 1980 + 1760 + 96 + 4
    ref = reference_mask(cfg) if preset == "tiny" else None
    dense = seq.dense_mask()
    if ref is not None:
        assert torch.equal(dense, ref)
    assert seq.attended_pairs == int(dense.sum())
    # each token's row is covered by exactly one call, and the calls' key spans do not overlap
    covered = torch.zeros(seq.total, dtype=torch.int64)
    for (q0, q1), keys in seq.calls:
        covered[q0:q1] += 1
        assert all(a[1] <= b[0] for a, b in zip(keys, keys[1:]))
    assert bool((covered == 1).all())
    # FlexAttention's mask function, evaluated on every (query, key) pair
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


def tiny_batch(cfg, b: int) -> DreamZeroBatch:
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    h, w = cfg.canvas
    n, apb = cfg.blocks, cfg.actions_per_block
    return DreamZeroBatch(video=r(b, cfg.frames, 3, h, w), tokens=torch.randint(0, cfg.text_vocab, (b, cfg.text_len),
                                                                                 generator=g),
                          state=r(b, cfg.state_tokens, cfg.state_dim), actions=r(b, n, apb, cfg.action_dim),
                          video_noise=r(b, n * cfg.frames_per_block, cfg.tokens_per_frame, cfg.patch_channels),
                          action_noise=r(b, n, apb, cfg.action_dim), time=torch.rand(b, n, generator=g))


def test_flops_per_sample_matches_flop_counter():
    """The math SDPA backend decomposes attention into bmm, which the counter sees. Inputs that
    come with the batch require grad, so their first matmuls get their full backward; the analytic
    count takes every trained matmul as 3x, so the two whose input has no gradient in any run are
    taken out here by hand: the clean latents' patch embedding (its input is the frozen VAE's
    output) and the text projection's first linear (its input is the frozen embedding's). The
    frozen stand-ins run forward only in both counts."""
    cfg, b = PRESETS["tiny"](), 2
    torch.manual_seed(0)
    model, batch = build_model("dreamzero", "tiny"), tiny_batch(cfg, 2)
    for name in ("state", "actions", "video_noise", "action_noise", "time"):
        getattr(batch, name).requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).backward()
    d = cfg.dim
    no_input_grad = 2 * cfg.latent_frames * cfg.tokens_per_frame * cfg.patch_channels * d + 2 * cfg.text_len * cfg.text_width * d
    assert counter.get_total_flops() == b * (flops_per_sample(cfg) - no_input_grad)


def test_5b_preset_is_the_stated_shape():
    cfg = PRESETS["5b"]()
    with torch.device("meta"):
        model = build_model("dreamzero", "5b")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 4.9e9 < trainable < 5.1e9
    assert (cfg.latent_frames, cfg.tokens_per_frame, cfg.horizon) == (9, 220, 96)
    assert PRESETS["14b"]().tokens_per_frame == 880
    # block-causal attention computes a third of full attention's pairs at these shapes
    assert TokenSequence.of(cfg).attended_pairs / TokenSequence.of(cfg).total ** 2 == pytest.approx(0.331, abs=1e-3)


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
    assert last < 0.9 * first, (first, last)  # measured: 3.49 -> 2.94 (flow-matching losses are noisy)
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
    """The shipped 5b configs are what their comments say, and `trainkit inspect` reports 14b at 1,
    2 and 8 GPUs: fp32 weights (4 bytes per parameter) and AdamW's two states (8 per trainable one),
    sharded over the GPUs, so 160 GiB before any activation at one GPU: it cannot train there
    (micro-batch 1, every block recomputed)."""
    from trainkit.estimate.inspect import inspect_model

    base = inspect_model(load_config(CONFIGS / "dreamzero_5b_baseline.toml", required=False))
    opt = inspect_model(load_config(CONFIGS / "dreamzero_5b_optimised.toml", required=False))
    assert base["micro_batch"] == 1 and base["fsdp"]["units"] == 1 and len(base["recompute"]["blocks"]) == 30
    assert opt["fsdp"]["block_units"] == 3 + 30 and opt["recompute"]["blocks"] == []
    assert base["flops_per_sample"]["3"] == opt["flops_per_sample"]["3"] == flops_per_sample(PRESETS["5b"]())
    sets = ["model.preset=14b", "train.micro_batch=1", "parallel.ac_stride={blocks = 1}"]
    reports = {w: inspect_model(load_config(CONFIGS / "dreamzero_5b_optimised.toml", sets, required=False), world_size=w)
               for w in (1, 2, 8)}
    trainable = reports[1]["params"]["trainable"]
    assert 14.0e9 < trainable < 14.5e9
    for w, r in reports.items():
        m = r["memory"]
        assert m["params_gib"] + m["optimizer_gib"] == pytest.approx(12 * trainable / w / 2 ** 30, rel=1e-3)
    assert not reports[1]["memory"]["fits"] and reports[2]["memory"]["fits"] and reports[8]["memory"]["fits"]
    assert reports[1]["memory"]["fits_from_world_size"] == 2

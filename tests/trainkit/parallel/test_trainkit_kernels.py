"""The kernel-level switches of parallelize(): the mask-free joint attention (`parallel.attention =
"varlen"`) and FP8 linears (`parallel.float8_modules`).

Oracles: a dense attention with the Pi0 block mask written out one (query, key) pair at a time in
float64 (outputs and input gradients, padding included), the masked model's loss and gradients
(the same function), and the module names of the full preset. FP8 needs a CUDA GPU: on the CPU it
is refused with one line; its numeric test runs only where CUDA with FP8 exists."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from trainkit.config import ParallelConfig
from trainkit.errors import ConfigError
from trainkit.models import build_model
from trainkit.models.pi05 import PRESETS, Pi05Batch, sample_flow
from trainkit.models.varlen_attention import pack_keys, varlen_prefix_suffix_attention
from trainkit.parallel import parallelize
from trainkit.parallel.attention import apply_attention
from trainkit.parallel.float8 import float8_targets

pytestmark = pytest.mark.timeout(120)
HAS_FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def block_mask(keep: torch.Tensor, a: int) -> torch.Tensor:
    """(B, P+A, P+A) allowed pairs: prefix queries see valid prefix keys, suffix queries see valid
    prefix keys and every suffix key; the prefix never sees the suffix."""
    b, p = keep.shape
    allowed = torch.zeros(b, p + a, p + a, dtype=torch.bool)
    for n in range(b):
        for i in range(p + a):
            for j in range(p + a):
                valid_prefix_key = j < p and bool(keep[n, j])
                allowed[n, i, j] = valid_prefix_key if i < p else (valid_prefix_key or j >= p)
    return allowed


def dense(q, k, v, allowed):
    """softmax(QK^T / sqrt(d) + mask) V, float64, K/V heads repeated to the query heads; (B, T, Hq*hd)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(scores, -1) @ v
    return out.transpose(1, 2).flatten(2)


def _keep(case: str, b: int, p: int) -> torch.Tensor:
    keep = torch.ones(b, p, dtype=torch.bool)
    keep[0, 9:] = False  # text padding
    keep[2, 3:] = False
    if case == "masked_slot":
        keep[1, 0:4] = False  # an image slot masked in one sample only (no pruning possible)
    return keep


def test_pack_keys_moves_valid_keys_to_the_front_in_order():
    keep = torch.tensor([[True, False, True, False], [False, True, True, True]])
    dest, cu, used = pack_keys(keep)
    packed = torch.empty(8, dtype=torch.long).index_copy_(0, dest, torch.arange(8))
    assert cu.tolist() == [0, 2, 5]
    assert packed[:5].tolist() == [0, 2, 5, 6, 7]  # sample 0's valid keys, then sample 1's
    assert sorted(packed[5:].tolist()) == [1, 3, 4]  # the padding keys after the last segment
    assert used.tolist() == [True] * 5 + [False] * 3


@pytest.mark.parametrize("case,hkv", [("text_padding", 1), ("masked_slot", 1), ("text_padding", 2)])
def test_varlen_attention_equals_dense_mask_with_gradients(case, hkv):
    b, hq, hd, p, a = 3, 4, 8, 12, 5
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, p + a, h, hd, generator=g, dtype=torch.float64, requires_grad=True)
               for h in (hq, hkv, hkv))
    keep = _keep(case, b, p)
    allowed = block_mask(keep, a)
    want = dense(q, k, v, allowed)
    got_p, got_s = varlen_prefix_suffix_attention(q[:, :p], k[:, :p], v[:, :p], q[:, p:], k[:, p:], v[:, p:], keep)
    torch.testing.assert_close(got_p, want[:, :p])
    torch.testing.assert_close(got_s, want[:, p:])
    # gradients through every valid output row (padded query rows are never read downstream)
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    rows = torch.cat([keep, torch.ones(b, a, dtype=torch.bool)], 1)[:, :, None]
    want_g = torch.autograd.grad((want * w * rows).sum(), (q, k, v))
    got = torch.cat([got_p, got_s], 1)
    got_g = torch.autograd.grad((got * w * rows).sum(), (q, k, v))
    for x, y in zip(got_g, want_g):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y)


def _batch(cfg, b: int = 3, seed: int = 0) -> Pi05Batch:
    g = torch.Generator().manual_seed(seed)
    actions = torch.randn(b, cfg.horizon, cfg.action_dim, generator=g)
    noise, time = sample_flow(actions, g)
    token_mask = torch.ones(b, cfg.text_len, dtype=torch.bool)
    token_mask[0, 10:], token_mask[1, 30:] = False, False
    image_mask = torch.ones(b, 2, dtype=torch.bool)
    image_mask[2, 1] = False
    return Pi05Batch(images=torch.randn(b, 2, 3, cfg.image_size, cfg.image_size, generator=g), image_mask=image_mask,
                     tokens=torch.randint(0, cfg.vocab, (b, cfg.text_len), generator=g), token_mask=token_mask,
                     actions=actions, noise=noise, time=time)


def test_varlen_model_gives_the_masked_loss_and_gradients():
    cfg = PRESETS["tiny"]()
    torch.manual_seed(0)
    masked = build_model("pi05", "tiny").double()
    with torch.no_grad():  # sharpen attention so the mask matters to the loss
        for layer in masked.lm_layers:
            layer.lm.qkv.weight.mul_(30)
            layer.expert.qkv.weight.mul_(30)
    varlen = build_model("pi05", "tiny").double()
    varlen.load_state_dict(masked.state_dict())
    assert apply_attention(varlen, "varlen") == cfg.lm_depth
    batch = _batch(cfg)
    batch = Pi05Batch(**{**batch.__dict__, "images": batch.images.double()})
    losses, grads = [], []
    for model in (masked, varlen):
        loss = model(batch)
        losses.append(loss)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-10, atol=1e-12)
    for x, y in zip(grads[1], grads[0]):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)
    # the check can fail: without the mask the loss differs
    nomask = Pi05Batch(**{**batch.__dict__, "all_valid": True})
    with torch.no_grad():
        assert not torch.allclose(masked(nomask), losses[0])


def test_float8_targets_are_the_gemma_mlp_linears_of_the_full_preset():
    with torch.device("meta"):
        model = build_model("pi05", "full")
    names = float8_targets(model, ["lm_layers.*.lm.mlp.*"])
    # 17 layers have a backbone MLP (the last one builds none): gate_up and down each
    assert len(names) == 34 and {n.rsplit(".", 1)[1] for n in names} == {"gate_up", "down"}
    assert all(".expert." not in n and "vision" not in n for n in names)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for CPU-only machines")
def test_float8_is_refused_on_cpu_with_one_line():
    model = build_model("pi05", "tiny")
    with pytest.raises(ConfigError, match=r"^parallel\.float8_modules: FP8 GEMMs need a CUDA GPU") as e:
        parallelize(model, ParallelConfig(fsdp="none", float8_modules=["lm_layers.*.lm.mlp.*"]), world_size=1)
    assert "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_varlen_kernel_on_cuda_equals_masked_sdpa():
    from trainkit.models.layers import prefix_suffix_attention
    b, hq, hd, p, a = 4, 8, 256, 96, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, p + a, h, hd, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, 1, 1))
    keep = torch.ones(b, p, dtype=torch.bool, device="cuda")
    keep[0, 40:], keep[1, 70:], keep[3, :32] = False, False, False
    args = (q[:, :p], k[:, :p], v[:, :p], q[:, p:], k[:, p:], v[:, p:], keep)
    for got, want in zip(varlen_prefix_suffix_attention(*args), prefix_suffix_attention(*args)):
        rows = keep[:, :, None] if got.shape[1] == p else torch.ones_like(got[..., :1], dtype=torch.bool)
        torch.testing.assert_close(got * rows, want * rows, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FP8, reason="needs a CUDA GPU with FP8 (sm89+)")
def test_float8_linears_track_bf16_on_cuda():
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False), torch.nn.GELU(), torch.nn.Linear(512, 256, bias=False))
    fp8 = copy.deepcopy(ref).cuda()
    from trainkit.parallel.float8 import apply_float8
    assert apply_float8(fp8, ["0", "2"]) == ["0", "2"]
    x = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", torch.bfloat16):
        got = fp8(x)
    want = ref.cuda()(x.float())
    assert (got.float() - want).norm() / want.norm() < 0.05


def test_packed_rows_outside_every_segment_cannot_leak_gradients(monkeypatch):
    """FlashAttention's varlen backward leaves the key rows past the last segment unwritten (any
    value, NaN included): the packing cuts them, so every gradient stays finite and exact."""
    import trainkit.models.varlen_attention as va
    reference = va.varlen_kernel

    class Garbage(torch.autograd.Function):
        @staticmethod
        def forward(ctx, k, v, cu_k):
            ctx.save_for_backward(cu_k)
            return k.clone(), v.clone()

        @staticmethod
        def backward(ctx, dk, dv):
            (cu_k,) = ctx.saved_tensors
            dk, dv = dk.clone(), dv.clone()
            dk[int(cu_k[-1]):], dv[int(cu_k[-1]):] = float("nan"), float("nan")
            return dk, dv, None

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k):
        k, v = Garbage.apply(k, v, cu_k)
        return reference(q, k, v, cu_q, cu_k, max_q, max_k)

    b, hq, hd, p, a = 3, 4, 8, 12, 5
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(b, p + a, h, hd, generator=g, dtype=torch.float64, requires_grad=True) for h in (hq, 1, 1))
    keep = _keep("masked_slot", b, p)
    args = (q[:, :p], k[:, :p], v[:, :p], q[:, p:], k[:, p:], v[:, p:], keep)
    want = torch.autograd.grad(sum(o.sum() for o in varlen_prefix_suffix_attention(*args)), (q, k, v))
    monkeypatch.setattr(va, "varlen_kernel", kernel)
    got = torch.autograd.grad(sum(o.sum() for o in varlen_prefix_suffix_attention(*args)), (q, k, v))
    for x, y in zip(got, want):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FP8, reason="needs a CUDA GPU with FP8 (sm89+)")
def test_tiny_model_with_both_switches_compiled_tracks_the_masked_bf16_loss_on_cuda():
    """parallelize(attention=varlen, FP8 GeGLU, compile) on the tiny preset, bf16 on the GPU: the
    loss stays within FP8's error of the plain masked model's, and every gradient is finite."""
    pytest.importorskip("torchao")
    cfg = PRESETS["tiny"]()
    torch.manual_seed(0)
    ref = build_model("pi05", "tiny").cuda().to(torch.bfloat16)
    fast = copy.deepcopy(ref)
    plan = parallelize(fast, ParallelConfig(fsdp="none", compile=True, attention="varlen",
                                            float8_modules=["lm_layers.*.lm.mlp.*"]), world_size=1)
    assert plan.applied[:2] == ["attention_varlen", "float8"] and len(plan.float8_linears) == 2
    batch = _batch(cfg, b=4).to("cuda")
    batch = Pi05Batch(**{**batch.__dict__, "images": batch.images.to(torch.bfloat16)})
    want, got = ref(batch), fast(batch)
    got.backward()
    assert abs(float(got) - float(want)) <= 0.02 * abs(float(want))
    assert all(torch.isfinite(p.grad).all() for p in fast.parameters() if p.grad is not None)


def test_inductor_settings_are_checked_against_torch_and_applied(monkeypatch):
    """`parallel.inductor`: each name must be a torch._inductor.config setting of the same type."""
    import torch._inductor.config as inductor

    from trainkit.parallel.compile import apply_inductor_config

    monkeypatch.setattr(inductor, "max_pointwise_cat_inputs", inductor.max_pointwise_cat_inputs)  # restored after
    apply_inductor_config({"max_pointwise_cat_inputs": 1})
    assert inductor.max_pointwise_cat_inputs == 1
    with pytest.raises(ConfigError, match=r"^parallel\.inductor\.no_such_knob: torch .* has no"):
        apply_inductor_config({"no_such_knob": 1})
    with pytest.raises(ConfigError, match=r"^parallel\.inductor\.max_pointwise_cat_inputs: expected int"):
        apply_inductor_config({"max_pointwise_cat_inputs": "one"})

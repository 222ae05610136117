"""The MoT joint attention of Pi0.5 `full` at training shapes (one layer, forward + backward, bf16, one
GPU): how much the prompt's key-padding mask costs, and which kernel path is cheapest with it.

    python3 bench/kernels/bench_attention_gpu.py [--batch 40] [--out results.json]

Shapes: B samples, prefix P = 512 image tokens (2 slots) + 200 text tokens of which the first
20-60 are valid (as the bench's shards: short task + state), suffix A = 50 action tokens,
8 query heads, 1 K/V head x 256. Variants (all compute the same function; each is checked
against the first within bf16 tolerance on the valid rows):
- model: `trainkit.models.layers.prefix_suffix_attention` with the mask (the model's path);
- no_mask: the same without any mask (what an unpadded prompt costs: the flash path);
- gqa_mask: `enable_gqa=True` with the mask instead of folding query heads;
- float_mask: the model's fold with an additive bf16 mask (0 / -inf) instead of a bool one;
- efficient: the model's fold + bool mask forced onto the memory-efficient kernel (not cuDNN);
- flex, flex_small: FlexAttention (compiled) with a key-padding BlockMask, whose fully masked key
  blocks are skipped (flex_small: 32x32 tiles, one stage, for head_dim 256's shared memory).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.record import header  # noqa: E402
from trainkit.models.layers import prefix_suffix_attention  # noqa: E402


def timed(fn, args, reps: int = 10) -> float:
    """Median-free mean ms of fwd+bwd over `reps` after 3 warm-ups."""
    for _ in range(3):
        out = fn(*args)
        sum(o.float().sum() for o in out if o is not None).backward()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
        sum(o.float().sum() for o in out if o is not None).backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=40)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    dev, dt = "cuda", torch.bfloat16
    b, img, text, act, hq, hd = a.batch, 512, 200, 50, 8, 256
    pl = img + text
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda *s: torch.randn(*s, device=dev, dtype=dt, generator=g).requires_grad_()  # noqa: E731
    qp, kp, vp = mk(b, pl, hq, hd), mk(b, pl, 1, hd), mk(b, pl, 1, hd)
    qs, ks, vs = mk(b, act, hq, hd), mk(b, act, 1, hd), mk(b, act, 1, hd)
    valid = torch.randint(20, 61, (b,), device=dev, generator=g)
    keep = torch.cat([torch.ones(b, img, dtype=torch.bool, device=dev),
                      torch.arange(text, device=dev)[None] < valid[:, None]], dim=1)
    res: dict = {**header(), "batch": b, "prefix": pl, "suffix": act, "valid_text_mean": float(valid.float().mean())}

    def gqa(qp, kp, vp, qs, ks, vs, keep):
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        m = keep[:, None, None, :]
        ms = torch.cat([keep, torch.ones(b, act, dtype=torch.bool, device=dev)], 1)[:, None, None, :]
        op = F.scaled_dot_product_attention(t(qp), t(kp), t(vp), attn_mask=m, enable_gqa=True)
        os_ = F.scaled_dot_product_attention(t(qs), t(torch.cat([kp, ks], 1)), t(torch.cat([vp, vs], 1)),
                                             attn_mask=ms, enable_gqa=True)
        return t(op).reshape(b, pl, -1), t(os_).reshape(b, act, -1)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    import trainkit.models.layers as layers

    def float_mask(*x):
        real = F.scaled_dot_product_attention

        def sdpa(q, k, v, attn_mask=None):
            if attn_mask is not None:
                attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
            return real(q, k, v, attn_mask=attn_mask)
        layers.F.scaled_dot_product_attention = sdpa
        try:
            return prefix_suffix_attention(*x)
        finally:
            layers.F.scaled_dot_product_attention = real

    def efficient(*x):
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return prefix_suffix_attention(*x)

    variants = {"model": lambda *x: prefix_suffix_attention(*x),
                "no_mask": lambda *x: prefix_suffix_attention(*x[:-1], None),
                "gqa_mask": gqa, "float_mask": float_mask, "efficient": efficient}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)

        def flex_variant(qp, kp, vp, qs, ks, vs, keep, opts=None):
            keep_s = torch.cat([keep, torch.ones(b, act, dtype=torch.bool, device=dev)], 1)
            bm_p = create_block_mask(lambda bb, h, qi, ki: keep[bb, ki], b, None, pl, pl, device=dev)
            bm_s = create_block_mask(lambda bb, h, qi, ki: keep_s[bb, ki], b, None, act, pl + act, device=dev)
            t = lambda x: x.transpose(1, 2)  # noqa: E731
            op = flex(t(qp), t(kp), t(vp), block_mask=bm_p, enable_gqa=True, kernel_options=opts)
            os_ = flex(t(qs), t(torch.cat([kp, ks], 1)), t(torch.cat([vp, vs], 1)), block_mask=bm_s, enable_gqa=True,
                       kernel_options=opts)
            return t(op).reshape(b, pl, -1), t(os_).reshape(b, act, -1)
        variants["flex"] = flex_variant
        variants["flex_small"] = lambda *x: flex_variant(*x, opts={"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16,
            "num_stages": 1, "num_warps": 4})
    except ImportError as e:
        res["flex_error"] = str(e)
    args = (qp, kp, vp, qs, ks, vs, keep)
    ref = [o.float() for o in prefix_suffix_attention(*args)]
    rows = keep[:, :, None]
    for name, fn in variants.items():
        try:
            out = fn(*args)
            if name != "no_mask":
                err = max(float(((o.float() - r) * (rows if i == 0 else 1)).abs().max())
                          for i, (o, r) in enumerate(zip(out, ref)))
                res[f"{name}_max_abs_err"] = round(err, 4)
            res[f"{name}_fwd_bwd_ms"] = round(timed(fn, args), 3)
        except Exception as e:  # noqa: BLE001
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps({k: v for k, v in res.items() if k.startswith(name)}), flush=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()

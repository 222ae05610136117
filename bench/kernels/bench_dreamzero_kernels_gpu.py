"""DreamZero's kernels on one GPU: the block-causal self-attention at the `5b` shapes (each kernel
fwd+bwd, checked against float32 dense masked attention) and one `14b` DiT block forward + backward.
A kernel bench beside the trainer bench (`python3 bench/gpu/gpu.py dreamzero`, bench/gpu/plans/dreamzero.toml);
moved here from the former bench_dreamzero_gpu script, whose trainer part the harness runs.

    python3 bench/kernels/bench_dreamzero_kernels_gpu.py --out $OUT/dreamzero_kernels.json     # on the device
    python3 bench/kernels/bench_dreamzero_kernels_gpu.py --out /tmp/dzk.json --cpu              # dry run: tiny, CPU

Attention cases: SDPA per block-causal part (default / flash / cuDNN / efficient backends),
FlexAttention with the block mask, SDPA with the dense mask, and full unmasked attention as the
cost reference (the CPU dry run: tiny, without the CUDA-only backends). Results in bench/results/dreamzero_h200.md
(DreamZero, attention).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.record import header  # noqa: E402


def timed(fn, device: str, warmup: int = 3, iters: int = 10) -> float:
    """Mean ms of fn() over `iters` after `warmup`: CUDA events on the GPU, the wall clock on the CPU."""
    import torch
    for _ in range(warmup):
        fn()
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def attention_kernels(batch: int, preset: str = "5b", device: str = "cuda") -> dict:
    """fwd+bwd of the block-causal self-attention at the preset's shapes, each kernel, against full
    attention (the CPU dry run: tiny, without the CUDA-only backends)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from trainkit.models.dreamzero import PRESETS, TokenSequence
    from trainkit.models.dreamzero.attention import block_causal_attention

    cfg = PRESETS[preset]()
    seq = TokenSequence.of(cfg)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, seq.total, cfg.heads, cfg.head_dim, device=device, dtype=torch.bfloat16,
                           generator=g).requires_grad_(True) for _ in range(3))
    grad = torch.randn(batch, seq.total, cfg.dim, device=device, dtype=torch.bfloat16, generator=g)
    ref = block_causal_attention(q.float(), k.float(), v.float(), seq, "dense")
    flop = 3 * 4 * batch * seq.attended_pairs * cfg.dim  # fwd + bwd of the block-causal work
    out = {"batch": batch, "tokens": seq.total, "pairs_fraction": round(seq.attended_pairs / seq.total ** 2, 4)}
    cases = {"blocks_default": ("blocks", None), "blocks_flash": ("blocks", SDPBackend.FLASH_ATTENTION),
             "blocks_cudnn": ("blocks", SDPBackend.CUDNN_ATTENTION),
             "blocks_efficient": ("blocks", SDPBackend.EFFICIENT_ATTENTION), "flex": ("flex", None),
             "dense_mask": ("dense", None), "full_no_mask": ("full", None)}
    if device != "cuda":
        cases = {k_: c for k_, c in cases.items() if k_ in ("blocks_default", "dense_mask", "full_no_mask")}
    for name, (kernel, backend) in cases.items():
        def step():
            if kernel == "full":
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
                o = o.transpose(1, 2).reshape(batch, seq.total, -1)
            else:
                o = block_causal_attention(q, k, v, seq, kernel)
            o.backward(grad)
            return o
        try:
            with sdpa_kernel(backend) if backend is not None else _null():
                ms = timed(step, device)
                err = None if kernel == "full" else float((step().detach().float() - ref).abs().max())
            out[name] = {"fwd_bwd_ms": round(ms, 3), "block_causal_tflops": round(flop / ms / 1e9, 1), "max_abs_err": err}
        except Exception as e:  # noqa: BLE001 - a kernel that does not run here is a result too
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        q.grad = k.grad = v.grad = None
        print(name, json.dumps(out[name]), flush=True)
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def block_timing(preset: str = "14b", device: str = "cuda") -> dict:
    """Forward + backward of one DiT block of `preset` over one sample (14b: 15,940 tokens), bf16, eager."""
    import torch
    from trainkit.models.dreamzero import PRESETS, TokenSequence
    from trainkit.models.dreamzero.flops import block_forward
    from trainkit.models.dreamzero.model import Layout, WanBlock
    from trainkit.models.dreamzero.rope import rope_tables

    cfg = PRESETS[preset]()
    seq = TokenSequence.of(cfg)
    torch.manual_seed(0)
    block = WanBlock(cfg).to(device, torch.bfloat16)
    for name, p in block.named_parameters():
        torch.nn.init.normal_(p, std=0.02 if p.dim() > 1 else 1.0) if "norm" not in name else torch.nn.init.ones_(p)
    x = torch.randn(1, seq.total, cfg.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    text = torch.randn(1, cfg.text_len, cfg.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    image = torch.randn(1, cfg.image_tokens, cfg.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    mod = (0.1 * torch.randn(1, cfg.blocks + 2, 6, cfg.dim, device=device)).requires_grad_(True)
    layout = Layout(seq, cfg.attention, rope_tables(seq, cfg.grid, cfg.head_dim, cfg.rope_theta, torch.device(device)))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = timed(lambda: block(x, mod, text, image, layout).sum().backward(), device, warmup=2, iters=5)
    flop = 3 * block_forward(cfg)
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None
    return {"preset": preset, "tokens": seq.total, "params": sum(p.numel() for p in block.parameters()),
            "fwd_bwd_ms": round(ms, 2), "tflops": round(flop / ms / 1e9, 3), "mfu": round(flop / ms / 1e-3 / 989e12, 4),
            "flop_fwd_bwd": flop, "peak_gib": None if peak is None else round(peak, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the result JSON")
    p.add_argument("--batch", type=int, default=4, help="samples of the attention cases")
    p.add_argument("--cpu", action="store_true", help="dry run: tiny preset, CPU kernels only")
    args = p.parse_args()
    import torch

    dev, preset = ("cpu", "tiny") if args.cpu else ("cuda", "5b")
    res = header()  # command, commit, dirty, date, machine, card (bench/record.py)
    res["attention"] = attention_kernels(batch=args.batch, preset=preset, device=dev)
    try:
        res["block_14b"] = block_timing("tiny" if args.cpu else "14b", dev)
    except Exception as e:  # noqa: BLE001 - recorded, like a kernel that does not run
        res["block_14b"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("block_14b", json.dumps(res["block_14b"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

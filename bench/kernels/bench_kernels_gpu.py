"""Kernel-level options of Pi0.5 `full` at its training shapes on one GPU (bf16, forward + backward):
the joint attention's mask-free options, FP8 rowwise GEMMs per linear family, and the GeGLU's
backward as Inductor compiles it.

    python3 bench/kernels/bench_kernels_gpu.py --out $OUT/kernels.json [--batch 32] [--cases a b ...]

Every case runs in its own process, all at once: compilation (CPU) overlaps; every case waits
until all have compiled, and the timed part holds an exclusive file lock, so no two cases use the
GPU while one times. Cases:
- attn_*: the joint attention of one MoT layer (prefix 512 image + 200 text tokens, 20-60 of the
  text valid, one image slot masked in a quarter of the samples; suffix 50; 8 query / 1 K/V head x
  256). masked = the model's SDPA with key-padding masks (cuDNN); no_mask = the same without masks
  (the cost of an unpadded prompt, NOT the same function); varlen = trainkit.models.varlen_attention
  (valid keys packed, FlashAttention-2 varlen); varlen_gqa = the same with the 8 query heads as
  heads (enable_gqa) instead of folded; cudnn_varlen = the packed layout through cuDNN's ragged
  attention (`aten._cudnn_attention_forward` with sequence offsets). *_compiled: inside
  torch.compile, as the model runs it (packing fused). Each is checked against masked: outputs on
  valid rows and q/k/v gradients.
- mlp_* / proj_*: Gemma-2B GeGLU (gate_up 2048 -> 32768, down 16384 -> 2048) at M = B x 712 tokens,
  its attention projections (qkv 2048 -> 2560, out 2048 -> 2048), the action expert's GeGLU
  (1024 -> 8192 -> 1024, M = B x 50) and SigLIP's MLP (1152 -> 4304 -> 1152, M = B x 512), each
  compiled, bf16 vs torchao rowwise FP8 (`trainkit.parallel.float8.apply_float8`).
- mlp_lm_bf16_nocat: the GeGLU compiled with Inductor's pointwise concatenation off
  (max_[complex_]pointwise_cat_inputs = 1), which decides how the (gate, up) gradient is written.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.record import header  # noqa: E402

LOCK = "/tmp/bench_kernels.lock"
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the same code at small shapes
ATTN = ["attn_masked", "attn_no_mask", "attn_varlen", "attn_varlen_gqa", "attn_cudnn_varlen",
        "attn_masked_compiled", "attn_varlen_compiled"]
LINEAR = ["mlp_lm_bf16", "mlp_lm_fp8", "mlp_lm_bf16_nocat", "proj_lm_bf16", "proj_lm_fp8",
          "mlp_expert_bf16", "mlp_expert_fp8", "mlp_vision_bf16", "mlp_vision_fp8"]


def sync() -> None:
    if DEV == "cuda":
        sync()


def ready(name: str) -> None:
    """Say this case has compiled, then wait (at most 200 s) until every case has: no case's first
    (compiling) step runs on the GPU while another one times."""
    folder = os.environ.get("BENCH_READY_DIR")
    if not folder:
        return
    Path(folder, name).touch()
    end = time.time() + 200
    while len(os.listdir(folder)) < int(os.environ["BENCH_CASES"]) and time.time() < end:
        time.sleep(0.2)


def timed(step, reps: int, name: str) -> float:
    """Mean ms of `step()` over `reps`, after warm-up, holding the GPU lock."""
    reps = int(os.environ.get("BENCH_REPS", reps))  # 1 for a CPU dry run
    step()
    sync()
    ready(name)
    with open(LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        for _ in range(4 if reps > 1 else 0):
            step()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        sync()
        return (time.perf_counter() - t0) / reps * 1e3


# --- attention ---------------------------------------------------------------------------------

def attention_inputs(b: int):
    dev, dt = DEV, torch.bfloat16
    img, text, act, hq, hd = 512, 200, 50, 8, 256
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda *s: torch.randn(*s, device=dev, dtype=dt, generator=g).requires_grad_()  # noqa: E731
    pl = img + text
    x = (mk(b, pl, hq, hd), mk(b, pl, 1, hd), mk(b, pl, 1, hd), mk(b, act, hq, hd), mk(b, act, 1, hd), mk(b, act, 1, hd))
    valid = torch.randint(20, 61, (b,), device=dev, generator=g)
    keep = torch.cat([torch.ones(b, img, dtype=torch.bool, device=dev),
                      torch.arange(text, device=dev)[None] < valid[:, None]], dim=1)
    keep[: b // 4, 256:512] = False  # the second slot masked in a quarter of the samples
    return (*x, keep)


class CudnnVarlen(torch.autograd.Function):
    """cuDNN ragged attention over packed (N, 1, hd) q/k/v with sequence offsets."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k):
        r = torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu_q, cu_k, max_q, max_k, True, 0.0, False, False)
        out, lse, seed, offset = r[0], r[1], r[6], r[7]
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seed, offset)
        ctx.max = (max_q, max_k)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k, seed, offset = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(dout.contiguous(), q, k, v, out, lse, seed, offset, None,
                                                               cu_q, cu_k, *ctx.max, 0.0, False)
        return dq, dk, dv, None, None, None, None


def attention_fn(name: str):
    import trainkit.models.varlen_attention as va
    from trainkit.models.layers import prefix_suffix_attention

    if name.startswith("attn_masked"):
        fn = prefix_suffix_attention
    elif name == "attn_no_mask":
        return lambda *x: prefix_suffix_attention(*x[:-1], None)
    elif name.startswith("attn_varlen") and name != "attn_varlen_gqa":
        fn = va.varlen_prefix_suffix_attention
    elif name == "attn_varlen_gqa":
        from torch.nn.attention.varlen import varlen_attn

        def grouped(q, k, v, key_keep):  # heads kept as heads: q (B*Tq, Hq, hd), k/v (packed, 1, hd)
            b, tq, hq, hd = q.shape
            dest, cu_k, used = va.pack_keys(key_keep)
            kp, vp = (torch.where(used[:, None, None], torch.zeros_like(x.reshape(-1, 1, hd)).index_copy(
                0, dest, x.reshape(-1, 1, hd)), 0) for x in (k, v))
            cu_q = torch.arange(0, b + 1, device=q.device, dtype=torch.int32) * tq
            out = varlen_attn(q.reshape(b * tq, hq, hd).contiguous(), kp, vp, cu_q, cu_k, tq, k.shape[1], enable_gqa=True)
            return out.reshape(b, tq, hq * hd)
        return _with_grouped(grouped)
    elif name == "attn_cudnn_varlen":
        def kernel(q, k, v, cu_q, cu_k, max_q, max_k):
            return CudnnVarlen.apply(q, k, v, cu_q, cu_k, max_q, max_k)
        orig = va.varlen_kernel

        def run(*x):
            va.varlen_kernel = kernel
            try:
                return va.varlen_prefix_suffix_attention(*x)
            finally:
                va.varlen_kernel = orig
        return run
    else:
        raise SystemExit(f"unknown case {name}")
    return torch.compile(fn) if name.endswith("_compiled") else fn


def _with_grouped(grouped):
    def run(qp, kp, vp, qs, ks, vs, keep):
        keep_s = torch.cat([keep, torch.ones(qs.shape[0], qs.shape[1], dtype=torch.bool, device=qs.device)], 1)
        return grouped(qp, kp, vp, keep), grouped(qs, torch.cat([kp, ks], 1), torch.cat([vp, vs], 1), keep_s)
    return run


def attention_case(name: str, b: int) -> dict:
    from trainkit.models.layers import prefix_suffix_attention
    x = attention_inputs(b)
    keep = x[-1]
    res: dict = {"case": name, "batch": b, "valid_prefix_mean": float(keep.float().sum(1).mean())}
    fn = attention_fn(name)
    w = [torch.randn(b, t, 2048, device=DEV, dtype=torch.bfloat16) for t in (712, 50)]
    rows = keep[:, :, None]

    def loss(out):
        return (out[0].float() * w[0] * rows).sum() + (out[1].float() * w[1]).sum()

    if name != "attn_no_mask":
        ref = prefix_suffix_attention(*x)
        ref_g = torch.autograd.grad(loss(ref), x[:6])
        out = fn(*x)
        got_g = torch.autograd.grad(loss(out), x[:6])
        res["max_abs_err_out"] = max(float(((o - r).float() * m).abs().max()) for o, r, m in zip(out, ref, (rows, 1)))
        # gradients of valid tokens (a padded token's q/k/v gradient is 0 in both but differs in rounding)
        r4 = keep[:, :, None, None]
        valid = [r4, r4, r4, 1, 1, 1]
        res["max_abs_err_grad"] = max(float(((gg - rg).float() * m).abs().max()) for gg, rg, m in zip(got_g, ref_g, valid))
        res["grad_scale"] = max(float(rg.float().abs().max()) for rg in ref_g)
        res["finite"] = all(bool(torch.isfinite(gg).all()) for gg in got_g)

    def step():
        out = fn(*x)
        torch.autograd.grad(loss(out), x[:6])
    res["fwd_bwd_ms"] = round(timed(step, 20, name), 3)
    return res


# --- linears -------------------------------------------------------------------------------------

class GeGLU(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.gate_up, self.down = nn.Linear(d, 2 * h, bias=False), nn.Linear(h, d, bias=False)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, -1)
        return self.down(F.gelu(g, approximate="tanh") * u)


class Proj(nn.Module):  # the LM's attention projections around an (absent) attention
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(2048, 2560, bias=False), nn.Linear(2048, 2048, bias=False)

    def forward(self, x):
        return self.out(self.qkv(x)[..., :2048])


class VisionMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(1152, 4304), nn.Linear(4304, 1152)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def linear_case(name: str, b: int) -> dict:
    family, prec = name.split("_")[1], name.split("_")[2]
    module, m, d = {"lm": (lambda: GeGLU(2048, 16384), b * 712, 2048) if name.startswith("mlp") else
                          (Proj, b * 712, 2048),
                    "expert": (lambda: GeGLU(1024, 4096), b * 50, 1024),
                    "vision": (VisionMLP, b * 512, 1152)}[family]
    torch.manual_seed(0)
    mod = module().to(DEV, torch.bfloat16)
    flops = 6 * m * sum(p.numel() for p in mod.parameters() if p.dim() == 2)
    if prec == "fp8":
        from trainkit.parallel.float8 import apply_float8
        apply_float8(mod, ["*"])
    if name.endswith("nocat"):
        for knob in ("max_pointwise_cat_inputs", "max_complex_pointwise_cat_inputs"):  # the second from torch 2.12
            if hasattr(torch._inductor.config, knob):
                setattr(torch._inductor.config, knob, 1)
    cmod = torch.compile(mod)
    x = (torch.randn(m, d, device=DEV, dtype=torch.bfloat16) * 0.5).requires_grad_()
    dy = torch.randn(m, d, device=DEV, dtype=torch.bfloat16)

    def step():
        y = cmod(x)
        y.backward(dy)
    ms = timed(step, 10, name)
    return {"case": name, "m": m, "fwd_bwd_ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--cases", nargs="*", default=ATTN + LINEAR)
    p.add_argument("--case", help="run one case in this process (the parent spawns these)")
    p.add_argument("--timeout", type=float, default=240)
    a = p.parse_args()
    if a.case:
        try:
            res = attention_case(a.case, a.batch) if a.case.startswith("attn") else linear_case(a.case, a.batch)
        except Exception as e:  # noqa: BLE001 - a failed option is a result
            res = {"case": a.case, "error": f"{type(e).__name__}: {str(e)[:400]}"}
            ready(a.case)  # (a second touch of a case already ready changes nothing)
        print("RESULT " + json.dumps(res), flush=True)
        return
    t0 = time.time()
    ready_dir = Path(tempfile.mkdtemp(prefix="bench_kernels_ready_"))
    procs = {c: subprocess.Popen([sys.executable, __file__, "--case", c, "--batch", str(a.batch)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                                      "TORCHINDUCTOR_COMPILE_THREADS": "1", "BENCH_READY_DIR": str(ready_dir),
                                      "BENCH_CASES": str(len(a.cases))})
             for c in a.cases}
    results = {**header(), "cases": {}}  # command, commit, dirty, date, machine, card (bench/record.py)
    for c, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=max(5.0, a.timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            text = "RESULT " + json.dumps({"case": c, "error": "timeout"})
        line = [x for x in text.splitlines() if x.startswith("RESULT ")]
        results["cases"][c] = json.loads(line[-1][7:]) if line else {"case": c, "error": text[-600:]}
        print(json.dumps(results["cases"][c]), flush=True)
    results["wall_s"] = round(time.time() - t0, 1)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""How fast does a GR00T-N1.7-shaped model train on H200s with FSDP2? Plain PyTorch, random init
(norm weights 1), synthetic inputs, bf16 params / fp32 reduce, SDPA; the form of
../shared/probes/gr00t_probe.py (N1.6), written for issue 29 (not a copy of a shared probe).
Shapes (LeRobot 0.6.1's GR00T N1.7 = the public checkpoint's config): Qwen3-VL ViT 24 x 1024 (mlp
4096, 16 heads), 2 cameras at 256x256 -> 256 patches of 16 (a still frame: the temporal patch's
kernel summed, one 768 -> 1024 matmul) -> 2x2 merger (LN per patch, 4096 -> 4096 -> GELU -> 2048)
-> 64 tokens each, and 3 deepstack mergers (after ViT blocks 5/11/17, LN after the merge) added
into LLM layers 0-2 at the image positions; Qwen3-VL-2B's LLM cut at 16 layers (2048, SwiGLU 6144,
16 q / 8 kv heads x 128, qk-norm, causal) over 2 x (64 + 2) image-run + 58 text tokens, all frozen
(forward only) with the ViT, mergers and embedding; trained: the head's LayerNorm, 4 VL
self-attention blocks (2048 = 32 x 64, FF 8192, no mask) over the 190 VL tokens, the 32-block DiT
(1536 = 32 x 48, FF 6144, AdaLayerNorm on the flow time; even blocks cross-attend to the 62 text
tokens when idx % 4 == 0, the 128 image tokens when idx % 4 == 2; odd blocks self-attend over 1
state + 40 action tokens), state/action dims 132, dropout 0.2 (diffusers' four places per block);
flow-matching MSE.
  torchrun --nproc-per-node N bench/probes/gr00t_n17_probe.py [variant ...]
MFU = analytic model FLOPs / 989e12: frozen parts forward only (1x), trained parts 3x."""
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.utils.checkpoint import checkpoint

PEAK = 989e12
P, IMG, TXT, A, AD, DROP = 256, 128, 62, 40, 132, 0.2  # patches/view; 2 x 64 image, 58 + 4 run-marker text; 40 x 132
VL = IMG + TXT
DEEP = (5, 11, 17)


class VBlock(nn.Module):  # Qwen3-VL ViT block (the 2-D RoPE is elementwise; left out)
    def __init__(s, d=1024, mlp=4096, h=16):
        super().__init__(); s.h = h
        s.n1, s.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.up, s.down = nn.Linear(d, mlp), nn.Linear(mlp, d)

    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        x = x + s.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, D))
        return x + s.down(F.gelu(s.up(s.n2(x)), approximate="tanh"))


class Merger(nn.Module):  # 2x2 patches -> one LLM token
    def __init__(s, after, d=1024):
        super().__init__(); s.after = after
        s.n = nn.LayerNorm(4 * d if after else d); s.fc1, s.fc2 = nn.Linear(4 * d, 4 * d), nn.Linear(4 * d, 2048)

    def forward(s, x):
        N, _, D = x.shape
        m = lambda y: y.view(N, 8, 2, 8, 2, -1).permute(0, 1, 3, 2, 4, 5).reshape(N, 64, -1)
        x = s.n(m(x)) if s.after else m(s.n(x))
        return s.fc2(F.gelu(s.fc1(x)))


class QwenLayer(nn.Module):
    def __init__(s, d=2048, mlp=6144, hq=16, hkv=8, hd=128):
        super().__init__(); s.hq, s.hkv, s.hd = hq, hkv, hd
        s.n1, s.n2, s.qn, s.kn = nn.RMSNorm(d), nn.RMSNorm(d), nn.RMSNorm(hd), nn.RMSNorm(hd)
        s.qkv = nn.Linear(d, (hq + 2 * hkv) * hd, bias=False); s.o = nn.Linear(hq * hd, d, bias=False)
        s.gate_up = nn.Linear(d, 2 * mlp, bias=False); s.down = nn.Linear(mlp, d, bias=False)

    def forward(s, x):
        B, T, _ = x.shape
        q, k, v = s.qkv(s.n1(x)).split([s.hq * s.hd, s.hkv * s.hd, s.hkv * s.hd], -1)
        q = s.qn(q.view(B, T, s.hq, s.hd)).transpose(1, 2)
        k = s.kn(k.view(B, T, s.hkv, s.hd)).transpose(1, 2)
        v = v.view(B, T, s.hkv, s.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + s.o(a.transpose(1, 2).reshape(B, T, -1))
        g, u = s.gate_up(s.n2(x)).chunk(2, -1)
        return x + s.down(F.silu(g) * u)


def drop(x):
    return F.dropout(x, DROP, True)


class VLBlock(nn.Module):  # vl_self_attention: pre-LN self-attention + FF over the VL tokens
    def __init__(s, d=2048, h=32):
        super().__init__(); s.h = h
        s.n1, s.n3 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.up, s.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        x = x + drop(drop(s.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, D))))
        return x + drop(s.down(drop(F.gelu(s.up(s.n3(x)), approximate="tanh"))))


class DiTBlock(nn.Module):
    def __init__(s, cross, d=1536, h=32, ff=6144, ctx=2048):
        super().__init__(); s.h, s.cross = h, cross
        s.n1 = nn.LayerNorm(d, elementwise_affine=False); s.ada = nn.Linear(d, 2 * d)
        s.q = nn.Linear(d, d); s.kv = nn.Linear(ctx if cross else d, 2 * d); s.o = nn.Linear(d, d)
        s.n3 = nn.LayerNorm(d, elementwise_affine=False); s.up, s.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(s, x, temb, ctx):
        B, T, D = x.shape
        scale, shift = s.ada(F.silu(temb)).unsqueeze(1).chunk(2, -1)
        h = s.n1(x) * (1 + scale) + shift
        src = ctx if s.cross else h
        k, v = s.kv(src).chunk(2, -1)
        heads = lambda t: t.view(B, -1, s.h, D // s.h).transpose(1, 2)
        a = F.scaled_dot_product_attention(heads(s.q(h)), heads(k), heads(v))
        x = x + drop(drop(s.o(a.transpose(1, 2).reshape(B, T, D))))
        return x + drop(s.down(drop(F.gelu(s.up(s.n3(x)), approximate="tanh"))))


class Gr00tN17(nn.Module):
    def __init__(s):
        super().__init__()
        s.patch = nn.Linear(16 * 16 * 3, 1024); s.pos = nn.Parameter(torch.zeros(P, 1024))
        s.vision = nn.ModuleList([VBlock() for _ in range(24)])
        s.merger = Merger(False); s.deep = nn.ModuleList([Merger(True) for _ in DEEP])
        s.embed = nn.Embedding(151936, 2048)
        s.llm = nn.ModuleList([QwenLayer() for _ in range(16)])
        s.vlln = nn.LayerNorm(2048)
        s.vl = nn.ModuleList([VLBlock() for _ in range(4)])
        s.state_enc = nn.Sequential(nn.Linear(AD, 1024), nn.ReLU(), nn.Linear(1024, 1536))
        s.w1, s.w2, s.w3 = nn.Linear(AD, 1536), nn.Linear(3072, 1536), nn.Linear(1536, 1536)
        s.apos = nn.Parameter(torch.zeros(1024, 1536))
        s.time = nn.Sequential(nn.Linear(256, 1536), nn.SiLU(), nn.Linear(1536, 1536))
        s.dit = nn.ModuleList([DiTBlock(cross=i % 2 == 0) for i in range(32)])
        s.norm_out = nn.LayerNorm(1536, elementwise_affine=False); s.proj_out = nn.Linear(1536, 1024)
        s.dec = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, AD))

    def frozen(s):
        return [s.patch, s.vision, s.merger, s.deep, s.embed, s.llm]

    def forward(s, patches, text, state, noisy, t, target, ac_vl, ac_dit):
        B, C = patches.shape[:2]
        with torch.no_grad():  # frozen ViT, mergers, embedding, all 16 LLM layers
            x = s.patch(patches.flatten(0, 1)) + s.pos
            deep = []
            for i, b in enumerate(s.vision):
                x = b(x)
                if i in DEEP:
                    deep.append(s.deep[DEEP.index(i)](x).reshape(B, IMG, 2048))
            img = s.merger(x).reshape(B, IMG, 2048)
            h = torch.cat([img, s.embed(text)], 1)  # images first here: the layout does not change the cost
            for i, l in enumerate(s.llm):
                h = l(h)
                if i < len(deep):
                    h = torch.cat([h[:, :IMG] + deep[i], h[:, IMG:]], 1)
        vl = s.vlln(h)
        for b in s.vl:
            vl = checkpoint(b, vl, use_reentrant=False) if ac_vl else b(vl)
        img, txt = vl[:, :IMG], vl[:, IMG:]
        freqs = torch.exp(torch.linspace(0, -8, 128, device=t.device))
        tsin = torch.cat([torch.sin(t[:, None] * 1000 * freqs), torch.cos(t[:, None] * 1000 * freqs)], -1).to(noisy.dtype)
        temb = s.time(tsin)
        a = s.w1(noisy)
        a = s.w3(F.silu(s.w2(torch.cat([a, temb[:, None].expand(-1, A, -1)], -1)))) + s.apos[:A]
        x = torch.cat([s.state_enc(state), a], 1)
        for i, b in enumerate(s.dit):
            ctx = txt if i % 4 == 0 else img
            x = checkpoint(b, x, temb, ctx, use_reentrant=False) if ac_dit and i % ac_dit == 0 else b(x, temb, ctx)
        return F.mse_loss(s.dec(s.proj_out(s.norm_out(x[:, 1:]))).float(), target.float())


def flops_per_sample():
    """Analytic model FLOPs of one sample: frozen parts forward (1x), trained parts 3x."""
    d, mlp = 1024, 4096
    vis = 2 * (24 * (2 * P * (4 * d * d + 2 * d * mlp) + 4 * P * P * d) + 2 * P * 768 * d)
    merge = 2 * 4 * 2 * 64 * (4096 * 4096 + 4096 * 2048)  # 2 views x (merger + 3 deepstack)
    T = VL
    qwen = 2 * T * (2048 * 32 * 128 + 16 * 128 * 2048 + 3 * 2048 * 6144) + 2 * T * T * 16 * 128  # causal: half
    vl = 2 * T * (4 * 2048 * 2048 + 2 * 2048 * 8192) + 4 * T * T * 2048
    S, d2, ff = A + 1, 1536, 6144
    cross_kv = lambda n: 2 * n * 2048 * 2 * d2
    blk = 2 * S * (2 * d2 * d2 + 2 * d2 * ff) + 2 * d2 * 2 * d2  # q, o, mlp; ada on one token
    self_blk = blk + 2 * S * 2 * d2 * d2 + 4 * S * S * d2
    cross_blk = lambda n: blk + cross_kv(n) + 4 * S * n * d2
    dit = 16 * self_blk + 8 * cross_blk(TXT) + 8 * cross_blk(IMG)
    heads = (2 * A * (AD * d2 + 3072 * d2 + d2 * d2) + 2 * (AD * 1024 + 1024 * d2)
             + 2 * A * (d2 * 1024 + 1024 * 1024 + 1024 * AD))
    return vis + merge + 16 * qwen + 3 * (4 * vl + dit + heads)


VARIANTS = {
    # name: mbs, wrap (root | block), ac_vl, ac_dit (stride, 0 = off), compile, fused
    "baseline_mbs16": dict(mbs=16, wrap="root", ac_vl=1, ac_dit=1, compile=False, fused=False),
    "perblock_mbs16": dict(mbs=16, wrap="block", ac_vl=0, ac_dit=0, compile=False, fused=True),
    "compile_mbs16": dict(mbs=16, wrap="block", ac_vl=0, ac_dit=0, compile=True, fused=True),
    "compile_mbs32": dict(mbs=32, wrap="block", ac_vl=0, ac_dit=0, compile=True, fused=True),
    "compile_mbs64": dict(mbs=64, wrap="block", ac_vl=0, ac_dit=0, compile=True, fused=True),
    "compile_mbs128": dict(mbs=128, wrap="block", ac_vl=0, ac_dit=0, compile=True, fused=True),
}


def main():
    dist.init_process_group("nccl"); rank = dist.get_rank(); torch.cuda.set_device(rank)
    for name in sys.argv[1:] or list(VARIANTS):
        torch.manual_seed(0)
        try:
            res = run(name, VARIANTS[name], rank)
        except torch.OutOfMemoryError:
            res = dict(variant=name, error="OOM")
        except Exception as ex:  # noqa: BLE001
            res = dict(variant=name, error=f"{type(ex).__name__}: {str(ex)[:200]}")
        if rank == 0:
            print(json.dumps(res), flush=True)
        torch.cuda.empty_cache(); dist.barrier()
    dist.destroy_process_group()


def run(name, v, rank):
    dev = torch.device("cuda", rank)
    with torch.device("meta"):
        model = Gr00tN17()
    for m in model.frozen():
        m.requires_grad_(False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if v["compile"]:
        for b in [*model.vision, *model.llm, *model.vl, *model.dit]:
            b.compile()
    if v["wrap"] == "block":
        for i in range(0, 24, 8):
            fully_shard(list(model.vision[i:i + 8]), mp_policy=mp)
        for l in model.llm:
            fully_shard(l, mp_policy=mp)
        fully_shard(list(model.vl), mp_policy=mp)
        for i in range(0, 32, 2):
            fully_shard(list(model.dit[i:i + 2]), mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=dev)
    for pname, p in model.named_parameters():  # norm weights 1 (0 would zero every GEMM operand)
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
        else:
            nn.init.ones_(p) if pname.endswith("weight") else nn.init.zeros_(p)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=v["fused"])
    B = v["mbs"]
    g = torch.Generator(device=dev).manual_seed(rank)
    patches = torch.randn(B, 2, P, 768, device=dev, generator=g)
    text = torch.randint(0, 151936, (B, TXT), device=dev, generator=g)
    state = torch.randn(B, 1, AD, device=dev, generator=g)
    noisy, target = torch.randn(B, A, AD, device=dev, generator=g), torch.randn(B, A, AD, device=dev, generator=g)
    t = torch.rand(B, device=dev, generator=g)

    def step():
        loss = model(patches, text, state, noisy, t, target, v["ac_vl"], v["ac_dit"])
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); dist.barrier()
    n = 10
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / n
    f = flops_per_sample()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dict(variant=name, **v, step_s=round(dt, 4), samples_s_gpu=round(B / dt, 2),
                mfu_pct=round(100 * B * f / dt / PEAK, 1), flops_per_sample_T=round(f / 1e12, 3),
                params_B=round(sum(p.numel() for p in model.parameters()) / 1e9, 3), trainable_B=round(trainable / 1e9, 3),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1))


if __name__ == "__main__":
    main()

"""What does DreamZero-5B (Wan2.2-TI2V-5B's DiT with action and state tokens) train at on H200s with FSDP2?
The form of ../shared/probes/dreamzero_probe.py, updated to the real block (trainkit/models/dreamzero):
30 blocks, dim 3072, 24 heads x 128, FFN 14336; norm1 (no affine) modulated -> q, k, v, o with RMSNorm
over the full width on q and k and 3-D RoPE (head dim split 44/42/42) -> gate; norm3 (affine) -> I2V
cross-attention, text K/V (512 tokens) and image K/V (257 CLIP tokens) with one softmax each, summed ->
o; norm2 modulated -> gelu-tanh FFN -> gate. Text MLP 4096->D->D, image MLPProj LN->1280->GELU->D->LN,
time MLP, action encoder W1/W2(swish)/W3 and state/action MLPs. 33 frames of a 352x640 canvas -> 9
latent frames x 11x20 = 1980 tokens; teacher forcing doubles them (clean + noisy) plus 96 action + 4
state tokens = 4060. Self-attention here is full (flash SDPA), a stand-in for the block-causal pattern
(30% of its pairs): MFU below counts full attention, as the probe runs it.
  torchrun --nproc-per-node N bench/probes/dreamzero_wan_probe.py [variant ...]
MFU = analytic model FLOPs (fwd+bwd = 3x fwd, recompute not counted) / 989e12."""
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.utils.checkpoint import checkpoint

PEAK = 989e12
D, L, H, FF, TXT, IMG, T = 3072, 30, 24, 14336, 512, 257, 4060
HD = D // H


def rope(x, cos, sin):
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2).to(x.dtype)


class WanBlock(nn.Module):
    def __init__(s):
        super().__init__()
        s.norm1, s.norm3, s.norm2 = nn.LayerNorm(D, elementwise_affine=False), nn.LayerNorm(D), nn.LayerNorm(D, elementwise_affine=False)
        s.q, s.k, s.v, s.o = (nn.Linear(D, D) for _ in range(4))
        s.nq, s.nk = nn.RMSNorm(D), nn.RMSNorm(D)
        s.cq, s.ck, s.cv, s.co, s.k_img, s.v_img = (nn.Linear(D, D) for _ in range(6))
        s.cnq, s.cnk, s.nk_img = nn.RMSNorm(D), nn.RMSNorm(D), nn.RMSNorm(D)
        s.ffn = nn.Sequential(nn.Linear(D, FF), nn.GELU(approximate="tanh"), nn.Linear(FF, D))
        s.modulation = nn.Parameter(torch.zeros(6, D))

    def forward(s, x, txt, img, e, cos, sin):
        B = x.shape[0]
        heads = lambda t: t.view(B, t.shape[1], H, HD).transpose(1, 2)  # noqa: E731
        m = (s.modulation + e).chunk(6, 1)  # e: (B, 6, D) time modulation
        h = s.norm1(x) * (1 + m[1]) + m[0]
        q, k = rope(s.nq(s.q(h)).view(B, T, H, HD), cos, sin), rope(s.nk(s.k(h)).view(B, T, H, HD), cos, sin)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), heads(s.v(h)))
        x = x + s.o(a.transpose(1, 2).reshape(B, T, D)) * m[2]
        q = heads(s.cnq(s.cq(s.norm3(x))))
        a = F.scaled_dot_product_attention(q, heads(s.cnk(s.ck(txt))), heads(s.cv(txt)))
        a = a + F.scaled_dot_product_attention(q, heads(s.nk_img(s.k_img(img))), heads(s.v_img(img)))
        x = x + s.co(a.transpose(1, 2).reshape(B, T, D))
        return x + s.ffn(s.norm2(x) * (1 + m[4]) + m[3]) * m[5]


class DreamZero5B(nn.Module):
    def __init__(s):
        super().__init__()
        s.patch = nn.Linear(48 * 4, D)  # (1,2,2) patch of 48-channel latents
        s.w1, s.w2, s.w3 = nn.Linear(32, D), nn.Linear(2 * D, D), nn.Linear(D, D)  # action encoder
        s.state = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, D))
        s.act_out = nn.Sequential(nn.Linear(D, 1024), nn.ReLU(), nn.Linear(1024, 32))
        s.txt = nn.Sequential(nn.Linear(4096, D), nn.GELU(approximate="tanh"), nn.Linear(D, D))
        s.img = nn.Sequential(nn.LayerNorm(1280), nn.Linear(1280, 1280), nn.GELU(), nn.Linear(1280, D), nn.LayerNorm(D))
        s.time = nn.Sequential(nn.Linear(256, D), nn.SiLU(), nn.Linear(D, D))
        s.time_proj = nn.Linear(D, 6 * D)
        s.blocks = nn.ModuleList([WanBlock() for _ in range(L)])
        s.head = nn.Linear(D, 48 * 4)

    def forward(s, lat, acts, state, txt, img, t, tgt_v, tgt_a, cos, sin, ac):
        f = torch.exp(torch.linspace(0, -9, 128, device=t.device))
        tf = torch.cat([torch.cos(t[:, None] * f), torch.sin(t[:, None] * f)], -1).to(lat.dtype)
        a = s.w3(F.silu(s.w2(torch.cat([s.w1(acts), tf[:, None, :1].expand(-1, acts.shape[1], D)], -1))))
        x = torch.cat([s.patch(lat), a, s.state(state)], 1)
        txt, img = s.txt(txt), s.img(img)
        e0 = s.time(tf)
        e = s.time_proj(F.silu(e0)).view(-1, 6, D)
        for i, b in enumerate(s.blocks):
            x = checkpoint(b, x, txt, img, e, cos, sin, use_reentrant=False) if ac and i % ac == 0 else \
                b(x, txt, img, e, cos, sin)
        nv = lat.shape[1]
        return F.mse_loss(s.head(x[:, :nv]).float(), tgt_v.float()) + F.mse_loss(s.act_out(x[:, nv:nv + 96]).float(), tgt_a.float())


def flops_per_sample():
    lin = 2 * T * (6 * D * D + 2 * FF * D) + 2 * (TXT + IMG) * 2 * D * D
    attn = 4 * T * T * D + 4 * T * (TXT + IMG) * D
    return 3 * L * (lin + attn)


VARIANTS = {
    "baseline_mbs1": dict(mbs=1, wrap="root", ac=1, compile=False),
    "compile_mbs1_noac": dict(mbs=1, wrap="block", ac=0, compile=True),
    "compile_mbs2_noac": dict(mbs=2, wrap="block", ac=0, compile=True),
    "compile_mbs3_noac": dict(mbs=3, wrap="block", ac=0, compile=True),
    "compile_mbs4_ac2": dict(mbs=4, wrap="block", ac=2, compile=True),
    "compile_mbs8_ac": dict(mbs=8, wrap="block", ac=1, compile=True),
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
        model = DreamZero5B()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if v["compile"]:
        for b in model.blocks:
            b.compile()
    if v["wrap"] == "block":
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=dev)
    for pname, p in model.named_parameters():  # norm weights 1 (0 would zero every GEMM operand)
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
        else:
            nn.init.ones_(p) if pname.endswith("weight") else nn.init.zeros_(p)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    B = v["mbs"]
    g = torch.Generator(device=dev).manual_seed(rank)
    r = lambda *shape: torch.randn(*shape, device=dev, generator=g)  # noqa: E731
    lat, acts, state = r(B, 3960, 192), r(B, 96, 32), r(B, 4, 64)
    txt, img, t = r(B, TXT, 4096), r(B, IMG, 1280), torch.rand(B, device=dev, generator=g) * 1000
    tv, ta = r(B, 3960, 192), r(B, 96, 32)
    ang = torch.arange(T, device=dev, dtype=torch.float32)[:, None] * torch.rand(HD // 2, device=dev, generator=g)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]  # (T, 1, HD/2): a RoPE table's shape and cost

    def step():
        model(lat, acts, state, txt, img, t, tv, ta, cos, sin, v["ac"]).backward(); opt.step(); opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); dist.barrier()
    n = 5; t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / n
    fl = B * flops_per_sample()
    return dict(variant=name, **v, params_B=round(params / 1e9, 2), step_s=round(dt, 3), samples_s_gpu=round(B / dt, 2),
                mfu_pct=round(100 * fl / dt / PEAK, 1), flops_per_sample_T=round(flops_per_sample() / 1e12, 1),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1))


if __name__ == "__main__":
    main()

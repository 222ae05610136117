"""Record the Level-2 DreamZero fixture (issue 31): the official `CausalWanModel` at tiny width, run
once on the CPU in float32 on seeded weights, batch, noise and timestep ids, through the official
training forward and loss; only its numbers are kept (tests/assets/dreamzero_fixture_{14b,5b}.json: the
Wan2.1-I2V backbone of the released checkpoints and the Wan2.2-TI2V one at the same widths), read by
tests/trainkit/models/dreamzero/test_dreamzero_fixture.py. Not part of the package; the official code is never copied, it is
imported from a checkout given here.

Run (torch, diffusers, transformers, einops, numpy: /tmp/lerobot-venv has them; plus the action
head's imports hydra-core, accelerate, peft, e.g. `pip install --no-deps --target /tmp/dz-extra
hydra-core omegaconf antlr4-python3-runtime==4.9.3 accelerate peft`):

    git clone https://github.com/dreamzero0/dreamzero DZ && git -C DZ checkout ab790c198fbce33503358efbbd4187ce9a89adf3
    for b in 14b 5b; do PYTHONPATH=/tmp/dz-extra python tools/dreamzero_fixture/make_fixture.py --dreamzero DZ \
        --backbone $b --out tests/assets/dreamzero_fixture_$b.json; done

What runs is the official code at that commit: `WANPolicyHead.forward`
(groot/vla/model/dreamzero/action_head/wan_flow_matching_action_tf.py: step ids shared per block,
action ids from their block's, add_noise / training_target / training_weight of
`FlowMatchScheduler(shift=5, sigma_min=0, extra_one_step=True).set_timesteps(1000, training=True)`,
the weighted video and action MSE) around `CausalWanModel._forward_train`
(groot/vla/model/dreamzero/modules/wan_video_dit_action_casual_chunk.py: teacher forcing
[clean latents | noisy latents | actions | states], the clean half at timestep 0). Replaced, each
because the official path cannot run on a CPU in float32 as written:
- the head's encoders (umT5, CLIP, the VAE; its __init__ loads them from the Hub): the fixture's
  features stand in (`policy_head`); its random draws return the fixture's noise and step ids and
  its bfloat16 autocast is off (`fixed_draws`);
- the self-attention kernel (`AttentionModule`, flash-attn by default, asserting CUDA; its "torch"
  backend casts to bfloat16): float32 SDPA. The one causal call (the clean blocks' queries over
  the whole clean half, `_process_clean_image_only`) gets flash-attn's semantics for
  seqlen_q < seqlen_k, the causal mask aligned to the bottom-right corner (flash-attn >= 2.1;
  SDPA's is_causal aligns top-left, which would shift it by a frame): query frame_seqlen + i sees
  keys 0 .. frame_seqlen + i, i.e. token-causal inside a clean block. Variant "flash" records
  that; variant "block" replaces it by the block-causal mask the docstrings describe (a clean
  block's queries see the first frame, the blocks before and their whole block), trainkit's choice
  (trainkit/models/dreamzero/sequence.py);
- the cross-attention kernel (`flash_attention`, CUDA only): float32 SDPA, no mask (as called).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from contextlib import contextmanager, nullcontext, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seeded  # noqa: E402

SEED = 20260431
B = 2
# the official constructor's arguments (tiny widths; CLIP's 257 tokens x 1280 are fixed by the
# official MLPProj and I2V cross-attention, so they stay)
OFFICIAL = dict(patch_size=(1, 2, 2), frame_seqlen=8, text_len=16, dim=32, ffn_dim=64, freq_dim=16, text_dim=24,
                out_dim=4, num_heads=2, num_layers=2, num_frame_per_block=2, action_dim=8, max_state_dim=8,
                hidden_size=16, num_action_per_block=4, num_state_per_block=1, cross_attn_norm=True, qk_norm=True,
                eps=1e-6)
# the two backbones' differences: 14b = Wan2.1-I2V (the released checkpoints: 4 mask + 4 first-frame
# channels concatenated to the 4 latent ones), 5b = Wan2.2-TI2V (latents alone)
BACKBONES = {"14b": dict(model_type="i2v", in_dim=12, concat_first_frame_latent=True),
             "5b": dict(model_type="ti2v", in_dim=4, concat_first_frame_latent=False)}
# the same model as trainkit's DreamZeroConfig overrides of the `tiny` preset: 17 frames of a 64x128
# canvas at VAE stride (4, 16, 16) -> 5 latent frames of 4x8 (8 tokens after the 2x2 patch) = one
# conditioning frame + 2 blocks of 2
TRAINKIT = dict(dim=32, depth=2, heads=2, ffn=64, latent_channels=4, vae_stride=[4, 16, 16], frames=17,
                view=[32, 64], frames_per_block=2, actions_per_block=4, states_per_block=1, action_dim=8, state_dim=8,
                mlp_hidden=16, text_len=16, text_width=24, image_grid=16, image_width=1280, freq_dim=16,
                attention="blocks")
C, FRAMES, H, W = 4, 5, 4, 8
BLOCKS, APB = 2, 4
# the head's step-id draw (B, latent frames); it keeps frame 0's and gives each block's frames the id
# of the block's first (timestep_id_block), so 123, 500, 7, 3 are overwritten
RAW_IDS = [[912, 350, 123, 77, 500], [15, 640, 7, 999, 3]]
INPUTS = {  # name: (shape, scale, offset); actions within [-1, 1] as the head asserts
    "latents": ((B, C, FRAMES, H, W), 1.0, 0.0), "noise": ((B, C, FRAMES, H, W), 1.7, 0.0),
    "cond": ((B, 4 + C, FRAMES, H, W), 1.0, 0.0), "text": ((B, 16, 24), 1.0, 0.0), "image": ((B, 257, 1280), 1.0, 0.0),
    "state": ((B, BLOCKS, 8), 1.0, 0.0), "actions": ((B, BLOCKS * APB, 8), 0.9, 0.0),
    "action_noise": ((B, BLOCKS * APB, 8), 1.7, 0.0)}
ACTION_MASK = [[1.0] * 8, [1.0] * 6 + [0.0] * 2]  # sample 1: a 6-dof robot, channels 6, 7 padding


def weight_spec(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(scale, offset) of one parameter: norms near 1, biases small, matrices ~ 1/sqrt(fan in),
    the head not zero (the official init zeroes it, which would hide the model)."""
    if name.endswith(".weight") and ("norm" in name or name.startswith("img_emb.proj.0") or
                                     name.startswith("img_emb.proj.4")):
        return 0.2, 1.0
    if "modulation" in name:
        return 0.5, 0.0
    if len(shape) == 1 or name.endswith(".b"):
        return 0.1, 0.0
    fan_in = shape[1] * (shape[2] * shape[3] * shape[4] if len(shape) == 5 else 1) if not name.endswith(".W") \
        else shape[1]
    return (3.0 / fan_in) ** 0.5, 0.0


def install_kernels(variant: str) -> None:
    """Float32 SDPA in place of the official flash-attn kernels (module docstring)."""
    from groot.vla.model.dreamzero.modules import wan2_1_attention, wan2_1_submodule

    fs, block = OFFICIAL["frame_seqlen"], OFFICIAL["frame_seqlen"] * OFFICIAL["num_frame_per_block"]
    original_init = wan2_1_attention.AttentionModule.__init__

    def init(self, num_heads, head_dim, *args, causal=False, **kwargs):
        original_init(self, num_heads, head_dim, *args, causal=causal, **kwargs)
        self.fixture_causal = causal

    def forward(self, q, k, v, q_lens=None, k_lens=None):
        assert q_lens is None and k_lens is None
        mask = None
        if self.fixture_causal:
            lq, lk = q.shape[1], k.shape[1]
            qi = torch.arange(lq)[:, None] + (lk - lq)  # absolute position of each query (bottom-right)
            kj = torch.arange(lk)[None, :]
            assert lk - lq == fs, "the causal call is the clean blocks' over the clean half"
            if variant == "flash":
                mask = kj <= qi
            else:  # whole blocks: keys before the end of the query's block
                mask = kj < fs + ((qi - fs) // block + 1) * block
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return out.transpose(1, 2)

    def cross(q, k, v, k_lens=None, **_):
        assert k_lens is None
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    wan2_1_attention.AttentionModule.__init__ = init
    wan2_1_attention.AttentionModule.forward = forward
    wan2_1_submodule.flash_attention = cross


def policy_head(model, sched, x: dict):
    """The official WANPolicyHead around `model`, built without its __init__ (which loads umT5, CLIP
    and the VAE): the attributes its training forward reads, set as __init__ sets them; the three
    encoders replaced by the fixture's features (`encode_prompt`, `encode_video`, `encode_image`)."""
    from groot.vla.model.dreamzero.action_head.wan_flow_matching_action_tf import WANPolicyHead

    head = WANPolicyHead.__new__(WANPolicyHead)
    torch.nn.Module.__init__(head)
    head.model, head.scheduler = model, sched
    head.num_frame_per_block, head._device, head._noise_logged = OFFICIAL["num_frame_per_block"], "cpu", False
    head.config = SimpleNamespace(decouple_video_action_noise=False, use_high_noise_emphasis=False,
                                  target_video_height=None, target_video_width=None)
    head.tune_diffusion_model = True
    head.tiled, head.tile_size_height, head.tile_size_width = True, 34, 34  # WANPolicyHeadConfig's defaults
    head.tile_stride_height, head.tile_stride_width = 18, 16
    head.encode_prompt = lambda input_ids, attention_mask: x["text"]
    head.encode_video = lambda video, *args, **kwargs: x["latents"]
    head.encode_image = lambda image, num_frames, height, width: (x["image"], x["cond"], x["cond"][:, 4:, :1])
    return head.eval()


@contextmanager
def fixed_draws(x: dict, ids: torch.Tensor):
    """The head's random draws (noise = randn_like(latents), step ids = randint(0, 1000, (B, F)),
    action noise = randn_like(actions)) return the fixture's tensors; its bfloat16 autocast is
    turned off (a float32 record)."""
    randn_like, randint, autocast = torch.randn_like, torch.randint, torch.amp.autocast

    def draw_like(t, *args, **kwargs):
        match = [k for k in ("noise", "action_noise") if x[k].shape == t.shape]
        assert len(match) == 1, t.shape
        return x[match[0]].clone()

    def draw_ids(low, high, size, *args, **kwargs):
        assert (low, high, tuple(size)) == (0, 1000, tuple(ids.shape))
        return ids.clone()

    torch.randn_like, torch.randint = draw_like, draw_ids
    torch.amp.autocast = lambda *args, **kwargs: nullcontext()
    try:
        yield
    finally:
        torch.randn_like, torch.randint, torch.amp.autocast = randn_like, randint, autocast


def run(dz_root: Path, backbone: str, variant: str) -> dict:
    sys.path.insert(0, str(dz_root))
    install_kernels(variant)
    from transformers.feature_extraction_utils import BatchFeature

    from groot.vla.model.dreamzero.modules.flow_match_scheduler import FlowMatchScheduler
    from groot.vla.model.dreamzero.modules.wan_video_dit_action_casual_chunk import CausalWanModel

    model = CausalWanModel(**OFFICIAL, **BACKBONES[backbone])
    state = {}
    specs = []
    for name, p in model.state_dict().items():
        scale, offset = weight_spec(name, tuple(p.shape))
        state[name] = seeded.tensor(SEED, name, p.shape, scale, offset)
        specs.append([name, list(p.shape), scale, offset])
    model.load_state_dict(state, strict=True)
    x = {k: seeded.tensor(SEED, k, shape, scale, offset) for k, (shape, scale, offset) in INPUTS.items()}
    sched = FlowMatchScheduler(shift=5, sigma_min=0.0, extra_one_step=True)  # WANPolicyHead.__init__'s
    sched.set_timesteps(1000, training=True)
    head = policy_head(model, sched, x)
    seen = {}
    model.register_forward_hook(lambda m, args, kwargs, out: seen.update(
        out=out, timestep=kwargs["timestep"], timestep_action=kwargs["timestep_action"]), with_kwargs=True)
    mask = torch.tensor(ACTION_MASK)[:, None, :].expand(B, BLOCKS * APB, 8)
    data = BatchFeature(data=dict(
        embodiment_id=torch.zeros(B, dtype=torch.long), action_mask=mask, state=x["state"], action=x["actions"],
        # (B, 1): the head multiplies has_real_action[:, None] into (B, A, D) errors; a (B,) vector broadcasts
        # there only when B is 1 or the horizon
        has_real_action=torch.ones(B, 1),
        images=torch.zeros(B, 17, 64, 128, 3),  # float in [-1, 1]: read for its shape only (the encoders are stubbed)
        text=torch.zeros(B, 16, dtype=torch.long), text_attention_mask=torch.ones(B, 16, dtype=torch.long)))
    # grad on: the official training path (blocks under torch.utils.checkpoint, whose wrapper unpacks
    # the block's (x, kv_cache) pair; the no-grad branch passes the pair on and fails)
    with torch.enable_grad(), fixed_draws(x, torch.tensor(RAW_IDS)), redirect_stdout(sys.stderr):
        out = head(None, data)
    video_pred, action_pred = (t.detach() for t in seen["out"])
    timestep = seen["timestep"]
    ids = torch.argmin((sched.timesteps[:, None] - timestep.flatten()[None]).abs(), dim=0).view(B, FRAMES)
    return {"weights": specs, "ids": ids.tolist(), "sigma": sched.sigmas[ids].tolist(), "timestep": timestep.tolist(),
            "timestep_action": seen["timestep_action"].tolist(),
            "weight": sched.training_weight(timestep.flatten()).unflatten(0, (B, FRAMES)).tolist(),
            "outputs": {"video": video_pred.flatten().tolist(), "video_shape": list(video_pred.shape),
                        "action": action_pred.flatten().tolist(), "action_shape": list(action_pred.shape),
                        "loss": out["loss"].item(), "video_loss": out["dynamics_loss"].item(),
                        "action_loss": out["action_loss"].item()}}


def fail(message: str) -> None:
    print(f"make_fixture: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dreamzero", type=Path, required=True, help="a checkout of github.com/dreamzero0/dreamzero")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backbone", choices=tuple(BACKBONES), default="14b")
    ap.add_argument("--variant", choices=("flash", "block"), help="(internal) run one variant, print JSON")
    args = ap.parse_args()
    if args.variant:  # one process per variant: the kernels are patched into the imported modules
        torch.manual_seed(0)
        print(json.dumps(run(args.dreamzero, args.backbone, args.variant)))
        return
    model_file = args.dreamzero / "groot/vla/model/dreamzero/modules/wan_video_dit_action_casual_chunk.py"
    commit = subprocess.run(["git", "-C", str(args.dreamzero), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if not model_file.is_file() or not (args.dreamzero / ".git").exists() or len(commit) != 40:
        fail(f"{args.dreamzero} is not a git checkout of DreamZero (no {model_file.name} or no commit to record)")
    runs = {}
    for variant in ("flash", "block"):
        done = subprocess.run([sys.executable, __file__, "--dreamzero", str(args.dreamzero), "--out", str(args.out),
                               "--backbone", args.backbone, "--variant", variant], capture_output=True, text=True)
        if done.returncode:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            fail(f"the official code failed (variant {variant}): {last}")
        runs[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    first, config = runs["flash"], BACKBONES[args.backbone]
    fixture = {
        "source": {"repository": "https://github.com/dreamzero0/dreamzero", "commit": commit,
                   "model": "groot/vla/model/dreamzero/modules/wan_video_dit_action_casual_chunk.py CausalWanModel",
                   "scheduler": "groot/vla/model/dreamzero/modules/flow_match_scheduler.py FlowMatchScheduler",
                   "loss": "groot/vla/model/dreamzero/action_head/wan_flow_matching_action_tf.py "
                           "WANPolicyHead.forward (encoders stubbed with the fixture's features, autocast off)",
                   "script": "tools/dreamzero_fixture/make_fixture.py", "torch": torch.__version__,
                   "kernels": "float32 SDPA; variant flash: flash-attn's bottom-right causal mask in the clean "
                              "half (token-causal inside a clean block); variant block: clean blocks see their "
                              "whole block"},
        "seed": SEED, "backbone": args.backbone,
        "official_config": {k: list(v) if isinstance(v, tuple) else v for k, v in {**OFFICIAL, **config}.items()},
        "trainkit_overrides": {**TRAINKIT, "first_frame_concat": config["concat_first_frame_latent"]}, "raw_ids": RAW_IDS, "ids": first["ids"], "action_mask": ACTION_MASK,
        "inputs": [[k, list(shape), scale, offset] for k, (shape, scale, offset) in INPUTS.items()],
        "weights": first["weights"], "sigma": first["sigma"], "timestep": first["timestep"],
        "timestep_action": first["timestep_action"], "weight": first["weight"],
        "outputs": {v: r["outputs"] for v, r in runs.items()}}
    for key in ("weights", "ids", "sigma", "timestep", "timestep_action", "weight"):
        assert runs["block"][key] == first[key], key
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes); loss flash {runs['flash']['outputs']['loss']:.6f} "
          f"block {runs['block']['outputs']['loss']:.6f}")


if __name__ == "__main__":
    main()

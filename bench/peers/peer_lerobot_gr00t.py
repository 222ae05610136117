"""The peer a user would pick: LeRobot 0.6.1's own GR00T N1.7 (`GR00TN17`) training step, timed on the GPU.

    python3 bench/peers/peer_lerobot_gr00t.py --out $OUT/lerobot_gr00t.json                 # LeRobot's default setting
    python3 bench/peers/peer_lerobot_gr00t.py --out X.json --settings fp32_autocast bf16_autocast --batch 64
    python3 bench/peers/peer_lerobot_gr00t.py --out X.json --tiny --device cpu --steps 3 --skip 1   # the whole path, tiny

Needs lerobot 0.6.1 importable with a Qwen3-VL transformers, diffusers and dm-tree (the device has
torch, transformers, safetensors, numpy; the rest travel as wheels installed with --no-deps:
bench/results/gr00t_h200.md has the command). Where `cv2` is missing an empty module stands in for
it (only GR00T's processor imports it, and this script never runs the processor).

The model: `GR00TN17` from its config (LeRobot's `GR00T_N1_7_DEFAULTS`, the backbone from the
hard-coded Cosmos-Reason2-2B Qwen3-VL config), random init built directly on the device, nothing
downloaded (HF_HUB_OFFLINE=1). Trainable as LeRobot's N1.7 fine-tuning: tune_llm and tune_visual
off, tune_top_llm_layers as trainkit's `n17` preset sets it (0), projector / diffusion model / vlln
on. `GrootPolicy`'s precision knobs are the settings (`SETTINGS`): `model_params_fp32` (every
parameter cast to float32, else the checkpoint's bfloat16) and `use_bf16` (the forward under bf16
autocast); its default, fp32 parameters under bf16 autocast, is `fp32_autocast`. It has no
gradient checkpointing option. The step, as LeRobot's trainer takes it (GrootPolicy.forward is
this under autocast): `model(inputs)["loss"]`, backward, `clip_grad_norm_(1.0)` (GrootConfig's),
fused AdamW (GrootConfig's lr / betas / eps / weight decay, its two groups: no decay on biases and
norms), zero_grad, `float(loss)` (the host sync LeRobot's `loss.item()` is).
Inputs, synthetic and seeded, the shapes of trainkit's gr00t bench plan (bench/gpu/plans/gr00t.toml,
preset n17): 2 views at 256x256 (64 tokens each) in transformers' Qwen3-VL patch layout, values in
[-1, 1]; a prompt of `text_len` (58) text tokens around the views' runs (Qwen3-VL's chat layout,
no padding), state (B, 1, 132) and a 40 x 132 action chunk with the generated robot's 8 state and 7
action channels random and the rest zero-padded (action_mask 1 on the 7), embodiment 10
("new_embodiment"). The model's own draws (flow noise, time, state dropout, dropout) are its own.
Samples/s = batch / median step time over the steps after `--skip`; MFU from trainkit's analytic
FLOP count of the same shapes (trainkit.models.gr00t.flops.flops_per_sample, 2 slots) / 989 TFLOP/s.
`--tiny`: trainkit's `tiny` gr00t preset's shapes (the Qwen3-VL config patched to them, 2 of its 4
LLM layers trained), on any device. Output: one JSON object {"settings": [{name, status,
samples_per_s, mfu, step_time_s, peak_mem_gib, losses, step_times_s, error, ...}], ...}, rewritten
(atomically) after each setting; a setting that fails is recorded ("oom" / "crash") and the next runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.peers.peer_report import run_settings  # noqa: E402

PEAK = 989e12  # H100/H200 dense bf16
SETTINGS = {  # name -> (GrootConfig.model_params_fp32, GrootConfig.use_bf16)
    "fp32_autocast": (True, True),  # LeRobot's default (the native N1.7 fine-tuning recipe)
    "bf16_autocast": (False, True),  # parameters left in the checkpoint's bfloat16
    "fp32": (True, False),  # use_bf16 off: float32 throughout
}
VIEWS = 2  # the bench plan's cameras (top, wrist)
ROBOT_STATE, ROBOT_ACTION = 8, 7  # the generated dataset's channels (bench/gpu/gpu.py), zero-padded to the model's
CHAT_PREFIX = 3  # text tokens before the views: <|im_start|>, "user", "\n"


def shapes(tiny: bool) -> Any:
    """trainkit's Gr00tConfig of the compared preset: the inputs' shapes and the FLOP count."""
    from trainkit.models import build_config

    return build_config("gr00t", "tiny" if tiny else "n17", {})


def tiny_qwen(cfg: Any) -> dict[str, Any]:
    """transformers' Qwen3-VL config (the keys LeRobot's Cosmos-Reason2-2B config sets) at the tiny preset's shapes."""
    text = {"attention_bias": False, "head_dim": cfg.head_dim, "hidden_act": "silu", "hidden_size": cfg.lm_width,
            "intermediate_size": cfg.lm_mlp, "max_position_embeddings": 4096, "num_attention_heads": cfg.heads_q,
            "num_hidden_layers": cfg.lm_depth, "num_key_value_heads": cfg.heads_kv, "rms_norm_eps": cfg.rms_eps,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": list(cfg.mrope_section), "rope_type": "default"},
            "rope_theta": cfg.rope_theta, "vocab_size": cfg.vocab}
    vision = {"deepstack_visual_indexes": list(cfg.deepstack), "depth": cfg.vision_depth,
              "hidden_act": "gelu_pytorch_tanh", "hidden_size": cfg.vision_width, "in_channels": 3,
              "intermediate_size": cfg.vision_mlp, "num_heads": cfg.vision_heads,
              "num_position_embeddings": cfg.position_table, "out_hidden_size": cfg.lm_width, "patch_size": cfg.patch,
              "spatial_merge_size": cfg.merge, "temporal_patch_size": cfg.temporal_patch}
    return {"image_token_id": cfg.image_token_id, "video_token_id": cfg.vocab - 1,
            "vision_start_token_id": cfg.vision_start_id, "vision_end_token_id": cfg.vision_end_id,
            "tie_word_embeddings": True, "text_config": text, "vision_config": vision}


def build(name: str, device: Any, cfg: Any, tiny: bool) -> Any:
    """LeRobot's GR00TN17 from its config, random init on `device`, trainable and cast as GrootPolicy sets it."""
    import torch
    from transformers import Qwen3VLConfig

    import lerobot.policies.groot.groot_n1_7 as n17
    from lerobot.policies.groot.modeling_groot import GrootPolicy
    from trainkit.models.gr00t.weights import n17_config

    if tiny:  # the backbone LeRobot builds by name, patched to tiny shapes; the head from the same preset
        n17._cosmos_reason2_qwen3_vl_config = lambda: Qwen3VLConfig(**tiny_qwen(cfg))
        overrides = n17_config(cfg)
    else:  # LeRobot's N1.7 defaults; only the trained LLM layers as trainkit's n17 preset sets them
        overrides = {"tune_top_llm_layers": cfg.lm_trained}
    config = n17.GR00TN17Config(tune_llm=False, tune_visual=False, tune_projector=True, tune_diffusion_model=True,
                                tune_vlln=True, **overrides)
    with torch.device(device):  # random init on the GPU: 3B parameters on the host take minutes
        model = n17.GR00TN17(config, load_backbone_weights=False)
    # GR00TN17.from_pretrained's trainable setup, then GrootPolicy's cast
    model.backbone.set_trainable_parameters(tune_llm=False, tune_visual=False,
                                            tune_top_llm_layers=config.tune_top_llm_layers)
    model.action_head.set_trainable_parameters(tune_projector=True, tune_diffusion_model=True, tune_vlln=True)
    if SETTINGS[name][0]:
        GrootPolicy._cast_model_parameters_to_fp32(model)
    else:
        model.to(torch.bfloat16)
    return model.to(device).train()


def inputs(cfg: Any, batch: int, device: Any, seed: int, embodiment: int) -> dict[str, Any]:
    """One batch in GR00TN17.forward's layout (what LeRobot's processor hands it), seeded, on `device`."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    gh, gw = cfg.image_height // cfg.patch, cfg.image_width // cfg.patch
    n = batch * VIEWS
    text_top = min(cfg.image_token_id, cfg.vision_start_id, cfg.vision_end_id)  # ordinary tokens lie below the specials
    run = [cfg.vision_start_id] + [cfg.image_token_id] * cfg.tokens_per_image + [cfg.vision_end_id]
    rows = []
    for _ in range(batch):
        text = torch.randint(1, text_top, (cfg.text_len,), generator=g).tolist()
        rows.append(text[:CHAT_PREFIX] + run * VIEWS + text[CHAT_PREFIX:])
    input_ids = torch.tensor(rows)
    pixels = torch.rand(n * gh * gw, 3 * cfg.temporal_patch * cfg.patch ** 2, generator=g).mul(2).sub(1)
    state = torch.zeros(batch, 1, cfg.state_dim)
    state[..., :ROBOT_STATE] = torch.randn(batch, 1, ROBOT_STATE, generator=g)
    action = torch.zeros(batch, cfg.horizon, cfg.action_dim)
    action[..., :ROBOT_ACTION] = torch.randn(batch, cfg.horizon, ROBOT_ACTION, generator=g)
    mask = torch.zeros_like(action)
    mask[..., :ROBOT_ACTION] = 1
    x = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "pixel_values": pixels,
         "image_grid_thw": torch.tensor([[1, gh, gw]] * n), "state": state, "action": action, "action_mask": mask,
         "embodiment_id": torch.full((batch,), embodiment)}
    return {k: v.to(device) for k, v in x.items()}


def run_setting(name: str, batch: int, steps: int, skip: int, device_name: str, tiny: bool,
                embodiment: int | None) -> dict[str, Any]:
    """Build, then time `steps` training steps of one setting; failures are recorded, not raised."""
    import torch

    from lerobot.policies.groot.modeling_groot import GrootPolicy
    from trainkit.models.gr00t.flops import flops_per_sample

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    params_fp32, autocast = SETTINGS[name]
    rec: dict[str, Any] = {"name": name, "batch": batch, "steps": steps, "skip": skip, "tiny": tiny,
                           "model_params_fp32": params_fp32, "use_bf16": autocast, "views": VIEWS,
                           "embodiment": embodiment, "status": None, "samples_per_s": None, "mfu": None,
                           "step_time_s": None, "peak_mem_gib": None, "losses": [], "step_times_s": [], "error": None}
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = opt = None
    try:
        torch.manual_seed(0)
        cfg = shapes(tiny)
        embodiment = cfg.embodiment if embodiment is None else embodiment
        rec["embodiment"] = embodiment
        t0 = time.perf_counter()
        model = build(name, device, cfg, tiny)
        rec["build_s"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: built in {rec['build_s']} s", flush=True)
        params = [p for p in model.parameters() if p.requires_grad]
        rec["params"] = sum(p.numel() for p in params)
        rec["params_total"] = sum(p.numel() for p in model.parameters())
        rec["params_backbone_trained"] = sum(p.numel() for p in model.backbone.parameters() if p.requires_grad)
        rec["tune_top_llm_layers"] = model.config.tune_top_llm_layers
        rec["prompt_tokens"] = VIEWS * (cfg.tokens_per_image + 2) + cfg.text_len
        groups = GrootPolicy._build_weight_decay_parameter_groups(model)
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-5, fused=True)
        x = inputs(cfg, batch, device, 0, embodiment)
        times, losses = [], []
        for _ in range(steps):
            sync()
            t = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = model(dict(x))["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())  # the step's end: a host sync, as GrootPolicy.forward's own
            times.append(time.perf_counter() - t)
        step_s = statistics.median(times[skip:])
        flops = flops_per_sample(cfg, VIEWS)
        rec.update(status="ok", step_time_s=step_s, samples_per_s=batch / step_s, mfu=batch * flops / step_s / PEAK,
                   flops_per_sample=flops, losses=losses, step_times_s=times,
                   peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
    except torch.OutOfMemoryError as e:
        rec.update(status="oom", error=str(e).splitlines()[0])
    except Exception as e:  # noqa: BLE001 - recorded; the next setting still runs
        rec.update(status="crash", error=f"{type(e).__name__}: {e}"[:2000])
    finally:
        del model, opt
        if cuda:
            torch.cuda.empty_cache()
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["fp32_autocast"])
    p.add_argument("--batch", type=int, default=16, help="micro-batch (the bench plan's main variants: 16)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="trainkit's tiny gr00t shapes (a CPU run of the whole path)")
    p.add_argument("--embodiment", type=int, default=None,
                   help="embodiment slot; default the preset's (10: LeRobot's new_embodiment; tiny: 1)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.skip < 0 or args.steps <= args.skip:
        print(f"bench/peers/peer_lerobot_gr00t.py: need --batch >= 1 and --steps > --skip >= 0, got --batch {args.batch} "
              f"--steps {args.steps} --skip {args.skip}", file=sys.stderr)
        return 2
    import torch

    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") and torch.cuda.is_available() else args.device
    return run_settings(args.out, args.settings, lambda name: run_setting(
        name, args.batch, args.steps, args.skip, args.device, args.tiny, args.embodiment), gpu)

if __name__ == "__main__":
    sys.exit(main())

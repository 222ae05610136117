"""LeRobot 0.6.1's `PI05Policy` as the oracle of trainkit's `pi05` family (run in the lerobot venv).

    $LEROBOT_VENV/bin/python tools/lerobot_oracle/pi05_oracle.py DIR [--roundtrip CKPT ...]
        # DIR/policy/ (save_pretrained) + DIR/oracle.npz; with --roundtrip, each CKPT's velocity too

It builds the policy at tiny widths (LeRobot hard-codes the full shapes in `get_gemma_config` and
in `PaliGemmaWithExpertModel.__init__`, so both are patched here; 8 query heads stay, which its
attention code requires), randomises EVERY parameter (LeRobot's init leaves the norms and the adaRMS
modulation at zero, which would hide a mapping error), saves it with `save_pretrained` (and a LeRobot normalizer pipeline with random statistics beside
it, `policy_preprocessor.json`), and writes
one batch (two cameras, the second masked in one sample; text padded), the velocity prediction,
the loss averaged over all 32 action channels and over the robot's 7, and the gradient of the
all-channel loss for every parameter (named as in `model.safetensors`).
`--roundtrip CKPT` loads each checkpoint folder (a `trainkit export`) with `PI05Policy.from_pretrained`,
refusing any load that LeRobot does not report as complete (it prints a warning and returns random
weights otherwise), and adds its velocity prediction for the same batch (`roundtrip/<i>`) and the statistics LeRobot's
`PolicyProcessorPipeline.from_pretrained` reads from its processor files (`roundtrip_stats/<i>/...`; the
normaliser steps, the tokenizer step given a stand-in).
`--full-shapes` also writes the key -> shape table of the full-size policy (on the meta device)
and its config.json, before the tiny patch. One process for all of it: importing LeRobot costs most of the ~10 s.
The shapes below are trainkit's `tiny` preset with `heads_q=8, vocab=1024`.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"vision_width": 32, "vision_depth": 2, "vision_mlp": 64, "vision_heads": 2, "patch": 4, "image_size": 16,
        "lm_width": 64, "lm_depth": 2, "lm_mlp": 128, "expert_width": 32, "expert_mlp": 64, "heads_q": 8,
        "heads_kv": 1, "head_dim": 16, "vocab": 1024, "horizon": 50, "action_dim": 32, "text_len": 48}
ROBOT_ACTION_DIM = 7
BATCH = 2


def patch_tiny() -> None:
    """Make LeRobot build the tiny shapes: its two hard-coded places, replaced."""
    import torch
    from transformers.models.auto import CONFIG_MAPPING

    from lerobot.policies import pi_gemma
    from lerobot.policies.pi05 import modeling_pi05 as m

    t = TINY

    def get_gemma_config(variant: str):
        if variant == "gemma_2b":
            return m.GemmaConfig(t["lm_width"], t["lm_depth"], t["lm_mlp"], t["heads_q"], t["heads_kv"], t["head_dim"])
        if variant == "gemma_300m":
            return m.GemmaConfig(t["expert_width"], t["lm_depth"], t["expert_mlp"], t["heads_q"], t["heads_kv"],
                                 t["head_dim"])
        raise ValueError(variant)

    def init(self, vlm_config, action_expert_config, use_adarms=None, precision="float32", image_size=16,
             freeze_vision_encoder=False, train_expert_only=False):
        # PaliGemmaWithExpertModel.__init__ of 0.6.1 with the vocab and vision shapes made tiny
        torch.nn.Module.__init__(self)
        use_adarms = use_adarms or [False, False]
        self.freeze_vision_encoder, self.train_expert_only = freeze_vision_encoder, train_expert_only
        hf = CONFIG_MAPPING["paligemma"]()
        hf._vocab_size = t["vocab"]
        hf.image_token_index = t["vocab"]
        tc = hf.text_config
        tc.hidden_size, tc.intermediate_size = vlm_config.width, vlm_config.mlp_dim
        tc.num_attention_heads, tc.head_dim = vlm_config.num_heads, vlm_config.head_dim
        tc.num_hidden_layers, tc.num_key_value_heads = vlm_config.depth, vlm_config.num_kv_heads
        tc.hidden_activation, tc.dtype, tc.vocab_size = "gelu_pytorch_tanh", "float32", t["vocab"]
        tc.use_adarms, tc.adarms_cond_dim = use_adarms[0], None
        vc = hf.vision_config
        vc.image_size, vc.patch_size = image_size, t["patch"]
        vc.hidden_size, vc.intermediate_size = t["vision_width"], t["vision_mlp"]
        vc.num_hidden_layers, vc.num_attention_heads = t["vision_depth"], t["vision_heads"]
        vc.projection_dim, vc.projector_hidden_act, vc.dtype = vlm_config.width, "gelu_fast", "float32"
        hf.projection_dim = vlm_config.width
        ex = CONFIG_MAPPING["gemma"](
            head_dim=action_expert_config.head_dim, hidden_size=action_expert_config.width,
            intermediate_size=action_expert_config.mlp_dim, num_attention_heads=action_expert_config.num_heads,
            num_hidden_layers=action_expert_config.depth, num_key_value_heads=action_expert_config.num_kv_heads,
            vocab_size=t["vocab"], hidden_activation="gelu_pytorch_tanh", dtype="float32", use_adarms=use_adarms[1],
            adarms_cond_dim=action_expert_config.width if use_adarms[1] else None)
        self.paligemma = pi_gemma.PaliGemmaForConditionalGenerationWithPiGemma(config=hf)
        self.gemma_expert = pi_gemma.PiGemmaForCausalLM(config=ex)
        self.gemma_expert.model.embed_tokens = None
        self.to_bfloat16_for_selected_params(precision)
        self._set_requires_grad()

    m.get_gemma_config = get_gemma_config
    m.PaliGemmaWithExpertModel.__init__ = init


def policy_config():
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi05.configuration_pi05 import PI05Config

    s = TINY["image_size"]
    return PI05Config(device="cpu", dtype="float32", image_resolution=(s, s), chunk_size=TINY["horizon"],
                      n_action_steps=TINY["horizon"], max_action_dim=TINY["action_dim"],
                      tokenizer_max_length=TINY["text_len"], push_to_hub=False,
                      input_features={"observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, s, s)),
                                      "observation.images.wrist": PolicyFeature(type=FeatureType.VISUAL, shape=(3, s, s)),
                                      "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(8,))},
                      output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ROBOT_ACTION_DIM,))})


def make_inputs(seed: int) -> dict:
    """One batch: 2 camera slots (slot 1 masked in sample 1), text padded differently per sample,
    actions zero beyond the robot's 7 channels (as the loader pads them), noise and time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t, s = TINY, TINY["image_size"]
    images = rng.uniform(-1, 1, (BATCH, 2, 3, s, s)).astype(np.float32)
    image_mask = np.array([[True, True], [True, False]])
    images[1, 1] = -1.0  # LeRobot's empty camera
    lengths = (t["text_len"] - 5, 13)
    tokens = np.zeros((BATCH, t["text_len"]), np.int64)
    token_mask = np.zeros((BATCH, t["text_len"]), bool)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(1, t["vocab"], n)  # 0 is padding (Gemma's pad id: no embedding gradient)
        token_mask[i, :n] = True
    actions = np.zeros((BATCH, t["horizon"], t["action_dim"]), np.float32)
    actions[..., :ROBOT_ACTION_DIM] = rng.normal(size=(BATCH, t["horizon"], ROBOT_ACTION_DIM))
    noise = rng.normal(size=(BATCH, t["horizon"], t["action_dim"])).astype(np.float32)
    time = np.array([0.83, 0.171], np.float32)
    return {"images": images, "image_mask": image_mask, "tokens": tokens, "token_mask": token_mask,
            "actions": actions, "noise": noise, "time": time}


def save_stats(folder: str) -> dict:
    """A LeRobot normalizer pipeline (`policy_preprocessor.json` + its safetensors) with random
    statistics of the robot's 8 state / 7 action channels, saved beside the policy; returns them."""
    import torch
    from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.processor import NormalizerProcessorStep, PolicyProcessorPipeline

    feats = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(8,)),
             "action": PolicyFeature(type=FeatureType.ACTION, shape=(ROBOT_ACTION_DIM,))}
    norm_map = {FeatureType.STATE: NormalizationMode.QUANTILES, FeatureType.ACTION: NormalizationMode.QUANTILES,
                FeatureType.VISUAL: NormalizationMode.IDENTITY}
    stats = {k: {s: torch.randn(n) for s in ("mean", "std", "min", "max", "q01", "q99")}
             for k, n in (("observation.state", 8), ("action", ROBOT_ACTION_DIM))}
    PolicyProcessorPipeline(steps=[NormalizerProcessorStep(features=feats, norm_map=norm_map, stats=stats)],
                            name="policy_preprocessor").save_pretrained(folder)
    return {f"stats/{k}.{s}": v.numpy() for k, d in stats.items() for s, v in d.items()}


def velocity_and_losses(policy, inputs: dict):
    """(velocity (B, H, 32), per-element losses) of PI05Pytorch.forward on `inputs`."""
    import torch

    x = {k: torch.from_numpy(v) for k, v in inputs.items()}
    captured = {}
    hook = policy.model.action_out_proj.register_forward_hook(lambda mod, args, out: captured.setdefault("v", out))
    try:
        losses = policy.model.forward([x["images"][:, i] for i in range(x["images"].shape[1])],
                                      [x["image_mask"][:, i] for i in range(x["image_mask"].shape[1])],
                                      x["tokens"], x["token_mask"], x["actions"], x["noise"], x["time"])
    finally:
        hook.remove()
    return captured["v"], losses


def make(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    patch_tiny()
    torch.manual_seed(args.seed)
    policy = PI05Policy(policy_config())
    with torch.no_grad():  # every parameter random, norms and adaRMS too (LeRobot's init leaves them 0)
        for name, p in policy.named_parameters():
            std = 0.3 if p.ndim == 1 else 0.2
            p.copy_(torch.randn_like(p) * std)
    policy.train()
    policy.save_pretrained(os.path.join(args.dir, "policy"))
    out = save_stats(os.path.join(args.dir, "policy"))
    inputs = make_inputs(args.seed)
    v, losses = velocity_and_losses(policy, inputs)
    loss_all = losses.mean()
    loss_real = losses[:, :, :ROBOT_ACTION_DIM].mean()
    loss_all.backward()
    out.update({f"in/{k}": v for k, v in inputs.items()})
    out.update({"velocity": v.detach().numpy(), "loss_all": loss_all.detach().numpy(),
                "loss_real": loss_real.detach().numpy()})
    sd_names = {id(p): n for n, p in policy.named_parameters()}
    for p in policy.parameters():
        if p.grad is not None:
            out[f"grad/{sd_names[id(p)]}"] = p.grad.numpy()
    out["keys"] = np.array(sorted(sd_names.values()))
    for i, path in enumerate(args.roundtrip):
        with torch.no_grad():
            out[f"roundtrip/{i}"] = velocity_and_losses(from_pretrained(path), inputs)[0].numpy()
        if os.path.exists(os.path.join(path, "policy_preprocessor.json")):  # statistics read by LeRobot itself
            from lerobot.processor import PolicyProcessorPipeline

            for name in ("policy_preprocessor", "policy_postprocessor"):
                pipe = PolicyProcessorPipeline.from_pretrained(path, config_filename=f"{name}.json",
                                                               overrides=no_tokenizer(path, name))
                step = next(s for s in pipe.steps if type(s).__name__ in ("NormalizerProcessorStep",
                                                                            "UnnormalizerProcessorStep"))
                for key, t in step.state_dict().items():
                    out[f"roundtrip_stats/{i}/{name}/{key}"] = t.numpy()
    np.savez(os.path.join(args.dir, "oracle.npz"), **out)


def no_tokenizer(path: str, name: str) -> dict:
    """Overrides giving a pipeline's tokenizer step a stand-in: an export of a run without
    model.tokenizer names the Hub's PaliGemma, which cannot be loaded offline (only the
    statistics are read here; pi05_serve_oracle.py serves an export with its tokenizer)."""
    import json

    steps = json.load(open(os.path.join(path, f"{name}.json")))["steps"]
    return {"tokenizer_processor": {"tokenizer": object()}} \
        if any(s.get("registry_name") == "tokenizer_processor" for s in steps) else {}


def full_shapes(path: str) -> None:
    """Key -> shape of the full-size PI05Policy's state dict (built on the meta device), as JSON;
    its config.json (LeRobot's defaults) into `full_config/` beside it."""
    import json

    import torch
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    cfg = PI05Config(device="cpu", dtype="float32",
                     input_features={"observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224))},
                     output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(7,))})
    to = torch.nn.Module.to
    torch.nn.Module.to = lambda self, *a, **k: self  # the policy moves itself to its device; on meta it stays
    try:
        with torch.device("meta"):
            sd = PI05Policy(cfg).state_dict()
    finally:
        torch.nn.Module.to = to
    with open(path, "w") as f:
        json.dump({k: list(v.shape) for k, v in sd.items()}, f)
    cfg.save_pretrained(os.path.join(os.path.dirname(path), "full_config"))


def from_pretrained(path: str):
    """PI05Policy.from_pretrained(path), strict; an error unless every key loaded (LeRobot itself
    only prints a warning and keeps random weights)."""
    import contextlib
    import io

    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        policy = PI05Policy.from_pretrained(path, strict=True)
    if "All keys loaded successfully!" not in text.getvalue():
        raise SystemExit(f"{path}: LeRobot did not load every key:\n{text.getvalue()}")
    return policy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--roundtrip", nargs="*", default=[], metavar="CKPT")
    p.add_argument("--full-shapes", action="store_true", help="also DIR/full_shapes.json (before the tiny patch)")
    args = p.parse_args()
    if args.full_shapes:
        full_shapes(os.path.join(args.dir, "full_shapes.json"))
    make(args)


if __name__ == "__main__":
    sys.exit(main())

"""The README.txt of a `pi05` export (`Weights.readme`): what the folder holds and how LeRobot 0.6.1
(`--format lerobot`) or openpi (`--format openpi`) serves it. trainkit/weights/serving.py writes it
beside the weights, processors and tokenizer, with the facts of the export (`ServingFacts`)."""
from __future__ import annotations

from trainkit.models.family import ServingFacts


def readme(f: ServingFacts) -> str:
    """The README.txt text of an export in format `f.fmt` ("" for a format without one)."""
    return {"lerobot": _lerobot, "openpi": _openpi}.get(f.fmt, lambda f: "")(f)


def _lerobot(f: ServingFacts) -> str:
    policy, tokenizer_name, carried, pipelines = f.policy, f.tokenizer_name, f.carried, f.pipelines
    cams = [k for k, v in policy["input_features"].items() if v["type"] == "VISUAL"]
    state = policy["input_features"].get("observation.state", {}).get("shape", ["?"])[0]
    served = ("policy_preprocessor.json, policy_postprocessor.json (+ their .safetensors): LeRobot 0.6.1's pi05 "
              "pipeline with the statistics the run trained with (normalise, state into the prompt, tokenizer at "
              f"max_length {policy.get('tokenizer_max_length')}, device; unnormalise).\n") if pipelines else ""
    tok = ("tokenizer/: the run's tokenizer (model.tokenizer): its tokenizer.model, and a Hugging Face tokenizer "
           "folder where it converts.\n") if carried else ""
    if pipelines and f.hf_folder:
        tok += (f"The tokenizer step loads {tokenizer_name!r}. Moved or uploaded this folder? Load with\n"
                "  make_pre_post_processors(cfg, pretrained_path=THIS, preprocessor_overrides={\"tokenizer_processor\": "
                "{\"tokenizer_name\": \"THIS/tokenizer\"}})\n(or \"google/paligemma-3b-pt-224\" when the run trained "
                "with PaliGemma's own tokenizer.model).\n")
    elif pipelines:  # name only files the export has
        tok += (f"The tokenizer step loads {tokenizer_name!r}, which this folder does not hold: from the Hugging Face "
                "Hub it needs the network (or the Hub cache).\n")
    return f"""A trainkit export (trainkit export --format lerobot) of a Pi0.5 policy for LeRobot 0.6.1.

model.safetensors + config.json: PI05Policy.from_pretrained(THIS).
{served}{tok}
Serve it on a raw observation (LeRobot's format: images (3, H, W) float in [0, 1], batch dimension optional):
  from lerobot.configs.policies import PreTrainedConfig
  from lerobot.policies.factory import make_pre_post_processors
  from lerobot.policies.pi05.modeling_pi05 import PI05Policy
  cfg = PreTrainedConfig.from_pretrained(THIS)          # cfg.device = "cuda" for a GPU, and below
  policy = PI05Policy.from_pretrained(THIS, config=cfg)
  pre, post = make_pre_post_processors(cfg, pretrained_path=THIS)
  action = post(policy.select_action(pre({{"observation.images.<camera>": ..., "observation.state": ..., "task": "..."}})))
Cameras: {", ".join(cams)} (leave out one the robot lacks: LeRobot masks it, as training masked blank cameras).
State: {state} values. Device: cpu, as written; on a GPU add
preprocessor_overrides={{"device_processor": {{"device": "cuda"}}}} to make_pre_post_processors.
{f.notes_text()}"""


def _openpi(f: ServingFacts) -> str:
    policy, norm, tokenizer, stats = f.policy, f.norm, f.carried, f.stats_file is not None
    quantiles = {"quantile": "use_quantile_norm=True (openpi's default for Pi0.5)",
                 "mean_std": "use_quantile_norm=False (the run normalised with mean and std)"}.get(
        norm, "no normalisation (the run had data.norm = none): leave the norm stats out")
    stats_line = (f"{f.stats_file}: the statistics the run trained with, in openpi's format. openpi reads\n"
                  "  CHECKPOINT/assets/<asset_id>/norm_stats.json, asset_id from your TrainConfig's data config:\n"
                  "  name it \"trainkit\" (AssetsConfig(asset_id=\"trainkit\")) or rename the folder to yours.\n"
                  if stats else "No statistics were written (the run's dataset index was unreadable).\n")
    tok_line = ("tokenizer/tokenizer.model: the tokenizer the run trained with. openpi loads PaliGemma's from\n"
                "  gs://big_vision/paligemma_tokenizer.model (cached in ~/.cache/openpi/big_vision/); put this one\n"
                "  there if it is another.\n" if tokenizer else
                "The run trained with trainkit's built-in prompt tokenizer, not PaliGemma's: openpi's prompts differ.\n")
    return f"""A trainkit export (trainkit export --format openpi) of a Pi0.5 policy for openpi (PyTorch).

model.safetensors: openpi's PyTorch layout (as its converter and lerobot/pi05_base write it; no config
is read from it). openpi's policy_config.create_trained_policy(train_config, THIS) loads it when
THIS holds model.safetensors.
{stats_line}{tok_line}
What openpi needs beside this folder: a TrainConfig (the training config name you pass) whose model is
  Pi0Config(pi05=True, action_horizon={policy.get("chunk_size")}, action_dim={policy.get("max_action_dim")}, max_token_len={policy.get("tokenizer_max_length")},
            paligemma_variant="gemma_2b", action_expert_variant="gemma_300m")
and whose data config has your robot's transforms (cameras: {", ".join(k for k, v in policy["input_features"].items() if v["type"] == "VISUAL")};
state {policy["input_features"].get("observation.state", {}).get("shape", ["?"])[0]} values; actions {policy["output_features"]["action"]["shape"][0]} values), {quantiles}.
{f.notes_text()}"""

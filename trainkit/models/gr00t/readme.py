"""The README.txt of a `gr00t` export to LeRobot 0.6.1 (`Weights.readme`, `--format lerobot`): what
the folder holds (config.json naming the N1.7 base folder, processors, the Qwen3-VL processor) and
how GrootPolicy serves it. trainkit/weights/serving.py writes it with the facts of the export."""
from __future__ import annotations

from trainkit.models.family import ServingFacts


def readme(f: ServingFacts) -> str:
    """The README.txt text of an export in format `f.fmt` ("" for a format without one)."""
    return lerobot_readme(f) if f.fmt == "lerobot" else ""


def lerobot_readme(f: ServingFacts) -> str:
    policy, tokenizer_name, pipelines = f.policy, f.tokenizer_name, f.pipelines
    cams = [k for k, v in policy["input_features"].items() if v["type"] == "VISUAL"]
    state = policy["input_features"].get("observation.state", {}).get("shape", ["?"])[0]
    served = ("policy_preprocessor.json, policy_postprocessor.json (+ their .safetensors): LeRobot 0.6.1's GR00T N1.7 "
              "pipeline with the statistics the run trained with (pack: state normalised, embodiment; VLM encode: "
              "views, chat template, tokenizer; device; unpack and unnormalise).\n") if pipelines else ""
    return f"""A trainkit export (trainkit export --format lerobot) of a GR00T N1.7 policy for LeRobot 0.6.1.

model.safetensors + config.json: GrootPolicy.from_pretrained(THIS). config.json's base_model_path names
{policy.get("base_model_path")} (THIS/n17: the N1.7 config GrootPolicy builds the model from before it loads
model.safetensors). Moved this folder? Set base_model_path to THIS/n17 (or the Hub's nvidia/GR00T-N1.7-3B for
N1.7's full widths, which downloads its 3B weights only to replace them).
{served}tokenizer/: the Qwen3-VL processor the VLM step loads ({tokenizer_name}); moved, load with
  make_pre_post_processors(cfg, pretrained_path=THIS, preprocessor_overrides={{"groot_n1_7_vlm_encode_v1":
  {{"model_name": "THIS/tokenizer"}}}})

Serve it on a raw observation (LeRobot's format: images (3, H, W) float in [0, 1], batch dimension optional):
  from lerobot.configs.policies import PreTrainedConfig
  from lerobot.policies.factory import make_pre_post_processors
  from lerobot.policies.groot.modeling_groot import GrootPolicy
  cfg = PreTrainedConfig.from_pretrained(THIS)
  policy = GrootPolicy.from_pretrained(THIS, config=cfg)
  pre, post = make_pre_post_processors(cfg, pretrained_path=THIS)
  action = post(policy.select_action(pre({{"observation.images.<camera>": ..., "observation.state": ..., "task": "..."}})))
Cameras, in this order: {", ".join(cams)} (GR00T has no missing-camera mask: give every one).
State: {state} values. Device: cpu, as written.
{f.notes_text()}"""

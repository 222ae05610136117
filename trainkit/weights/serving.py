"""What an export carries beside its weights so that LeRobot or openpi can serve it.

    files, notes = serving_files(fam, model_cfg, policy, stats, norm, fmt, out, tokenizer_name, notes)

- `--format lerobot`: LeRobot 0.6.1's processor pipelines for the policy (the family's steps,
  lerobot_processors.py), with the statistics the run trained with, so that
  `make_pre_post_processors(cfg, pretrained_path=OUT)` + `policy.select_action` run on a raw
  observation (images, state, task string). Without statistics (the run's dataset index unreadable)
  no pipeline is written: a pipeline without them would pass the state through unnormalised.
- `--format openpi`: `assets/trainkit/norm_stats.json` (openpi's layout; its asset id "trainkit").
- Both: the run's tokenizer (`model.tokenizer`) in `tokenizer/`: its SentencePiece model, and
  where it converts exactly a Hugging Face tokenizer folder (hf_tokenizer.py). LeRobot's tokenizer
  step names a tokenizer by Hub name or path and loads it with `AutoTokenizer.from_pretrained`;
  LeRobot's own pi05 exports name "google/paligemma-3b-pt-224", which needs the network or the Hub
  cache. Here the step names OUT/tokenizer by its absolute path (works offline, on this machine)
  unless `tokenizer_name` is given (e.g. the Hub name, for an upload); a run with no
  `model.tokenizer` gets the family's default and a note.
- README.txt: what the folder holds and what a LeRobot or openpi user still needs.
`notes` are the places where the served policy would not see what the trained one saw (the
exporter prints them; README.txt repeats them).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainkit.errors import ConfigError
from trainkit.models.family import Family
from trainkit.weights.hf_tokenizer import tokenizer_files
from trainkit.weights.lerobot_processors import Stats, processor_files
from trainkit.weights.norm_stats import OPENPI_STATS, stats_files

TOKENIZER_DIR = "tokenizer"
README = "README.txt"


def _run_tokenizer(model_cfg: Any) -> Path | None:
    """The SentencePiece file the run's prompts were built with (`model.tokenizer`: a file or a
    folder holding tokenizer.model), None when the family or the run has none."""
    if hasattr(model_cfg, "tokenizer_file"):  # the family resolves its words ("tiny", "builtin")
        path = model_cfg.tokenizer_file()
        if path is None:
            return None
    else:
        name = getattr(model_cfg, "tokenizer", "")
        if not name:
            return None
        path = Path(name) / "tokenizer.model" if Path(name).is_dir() else Path(name)
    if not path.is_file():
        raise ConfigError("model.tokenizer", f"{path}: not found (the run's tokenizer, which the export carries; "
                          "export from the run's working directory or put the file back)")
    return path


def serving_files(fam: Family, model_cfg: Any, policy: Mapping[str, Any], stats: Stats | None, norm: str, fmt: str,
                  out: Path, tokenizer_name: str | None, notes: Sequence[str] = ()
                  ) -> tuple[dict[str, bytes], list[str]]:
    """(files by relative name, notes) for an export to `out` (its final, absolute path) of format `fmt`;
    `policy`: its config.json; `norm`: the run's data.norm; `notes`: the exporter's own, first
    (a mixture's source: which one, its prompt)."""
    files: dict[str, bytes] = {}
    notes = list(notes)
    own = fam.weights is not None and fam.weights.lerobot_policy is not None and fmt == "lerobot"
    tokenizer = None if own else _run_tokenizer(model_cfg)  # the family's lerobot_policy carries its own
    converted = own
    if tokenizer is not None:
        tok_files, problem = tokenizer_files(tokenizer)
        files.update({f"{TOKENIZER_DIR}/{k}": v for k, v in tok_files.items()})
        converted = problem is None
        if problem:
            notes.append(f"model.tokenizer {problem}: no Hugging Face tokenizer could be written that tokenizes "
                         f"as it does, so LeRobot's tokenizer step names the default tokenizer")
    if stats is not None and fmt == "openpi":
        files.update(stats_files(stats, fmt, norm))
    if fmt == "lerobot" and fam.weights is not None and fam.weights.lerobot_processors is not None:
        pipelines, family_notes = fam.weights.lerobot_processors(
            model_cfg, policy, tokenizer_name or (str(out / TOKENIZER_DIR) if converted else None))
        if stats is None:
            notes.append("no statistics (the run's dataset index is unreadable), so no processor files: "
                         "LeRobot's make_pre_post_processors(cfg, pretrained_path=OUT) will not find them")
        else:
            files.update(processor_files(pipelines, policy, stats, norm))
            notes += family_notes
        readme = _groot_readme if policy.get("type") == "groot" else _lerobot_readme
        files[README] = readme(policy, _tokenizer_name(pipelines), tokenizer is not None, notes,
                               stats is not None, converted and tokenizer is not None).encode()
    elif fmt == "openpi":
        files[README] = _openpi_readme(policy, norm, tokenizer is not None, stats is not None, notes).encode()
    return files, notes


def _tokenizer_name(pipelines: Mapping[str, list[dict[str, Any]]]) -> str | None:
    steps = [s for steps in pipelines.values() for s in steps if s["registry_name"] == "tokenizer_processor"]
    if steps:
        return steps[0]["config"].get("tokenizer_name")
    vlm = [s for steps in pipelines.values() for s in steps if s["registry_name"] == "groot_n1_7_vlm_encode_v1"]
    return vlm[0]["config"]["model_name"] if vlm else None


def _notes(notes: list[str]) -> str:
    return "".join(f"\nNOTE: {n}.\n" for n in notes)


def _lerobot_readme(policy: Mapping[str, Any], tokenizer_name: str | None, carried: bool, notes: list[str],
                    pipelines: bool, hf_folder: bool) -> str:
    """README.txt of a Pi0.5 export; `carried`: tokenizer/ holds the run's tokenizer.model, `hf_folder`:
    and a Hugging Face tokenizer folder (what LeRobot's tokenizer step can load). It names only the
    files the export has."""
    cams = [k for k, v in policy["input_features"].items() if v["type"] == "VISUAL"]
    state = policy["input_features"].get("observation.state", {}).get("shape", ["?"])[0]
    served = ("policy_preprocessor.json, policy_postprocessor.json (+ their .safetensors): LeRobot 0.6.1's pi05 "
              "pipeline with the statistics the run trained with (normalise, state into the prompt, tokenizer at "
              f"max_length {policy.get('tokenizer_max_length')}, device; unnormalise).\n") if pipelines else ""
    tok = ("tokenizer/: the run's tokenizer (model.tokenizer): its tokenizer.model, and a Hugging Face tokenizer "
           "folder where it converts.\n") if carried else ""
    if pipelines and hf_folder:
        tok += (f"The tokenizer step loads {tokenizer_name!r}. Moved or uploaded this folder? Load with\n"
                "  make_pre_post_processors(cfg, pretrained_path=THIS, preprocessor_overrides={\"tokenizer_processor\": "
                "{\"tokenizer_name\": \"THIS/tokenizer\"}})\n(or \"google/paligemma-3b-pt-224\" when the run trained "
                "with PaliGemma's own tokenizer.model).\n")
    elif pipelines:
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
{_notes(notes)}"""


def _groot_readme(policy: Mapping[str, Any], tokenizer_name: str | None, carried: bool, notes: list[str],
                  pipelines: bool, hf_folder: bool) -> str:
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
{_notes(notes)}"""


def _openpi_readme(policy: Mapping[str, Any], norm: str, tokenizer: bool, stats: bool, notes: list[str]) -> str:
    quantiles = {"quantile": "use_quantile_norm=True (openpi's default for Pi0.5)",
                 "mean_std": "use_quantile_norm=False (the run normalised with mean and std)"}.get(
        norm, "no normalisation (the run had data.norm = none): leave the norm stats out")
    stats_line = (f"{OPENPI_STATS}: the statistics the run trained with, in openpi's format. openpi reads\n"
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
{_notes(notes)}"""


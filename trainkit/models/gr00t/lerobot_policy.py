"""What LeRobot 0.6.1 serves a `gr00t` export with (`trainkit export --format lerobot`): its
`GrootPolicy` folder, written as its `save_pretrained` writes one, so that

    policy = GrootPolicy.from_pretrained(OUT); pre, post = make_pre_post_processors(cfg, pretrained_path=OUT)
    action = post(policy.select_action(pre(observation)))

runs on a raw observation (camera frames, state, task string) from the folder alone, offline.

- `config.json`: the policy's `GrootConfig` ("type": "groot"): the robot's cameras, state and
  action sizes, chunk = the model's horizon, fp32 on the CPU (`use_bf16` off for a float32 export),
  4 inference steps (`SAMPLE_STEPS`), `base_model_path` = OUT/n17 by its absolute path.
- `n17/`: what `GrootPolicy.__init__` builds its `GR00TN17` from (`GR00TN17.from_pretrained(base_model_path)`):
  the model's N1.7 config.json (weights.py `config_json`) and a model.safetensors without tensors
  (every weight comes from OUT/model.safetensors right after, under `_groot_model.`). LeRobot's
  own fine-tunes name the Hub's nvidia/GR00T-N1.7-3B there, which downloads 3B weights it then
  replaces and only builds N1.7's full widths.
- `tokenizer/`: the Qwen3-VL processor LeRobot's VLM step loads (`AutoTokenizer`,
  `Qwen2VLImageProcessor`, `Qwen3VLVideoProcessor` from one folder): the run's tokenizer files
  (`model.tokenizer`) or the builtin stand-in's (chat_tokenizer.py), plus image processor configs
  at the model's patch, merge and view size.
- the processor pipelines (`lerobot_processors`, written by trainkit/weights/lerobot_processors.py):
  rename, batch, N1.7's pack step (state normalised into [-1, 1] by min / max that reproduce the
  run's normalisation: quantile q01 / q99, mean_std mean -/+ std; no clipping, as datakit's affine
  has none; the model's embodiment slot as "new_embodiment"; the cameras in the run's slot order),
  the VLM step (the view transform of trainkit's loader at evaluation: N1.7's bicubic resize, centre
  crop and resize back, or a plain resize, `model.view_transform`; the chat template and tokenizer
  of OUT/tokenizer), device; after the model, unpack and
  unnormalise with the same statistics (no clipping), CPU.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainkit.errors import ConfigError
from trainkit.models.gr00t.batches import N17_CROP_FRACTION, eval_crop
from trainkit.models.gr00t.chat_tokenizer import BUILTIN_TEMPLATE, QWEN_IDS, SPECIAL, QwenChatTokenizer
from trainkit.models.gr00t.config import Gr00tConfig
from trainkit.models.gr00t.model import SAMPLE_STEPS

BASE_DIR = "n17"  # OUT/n17: the GR00TN17 base folder GrootConfig.base_model_path names
TOKENIZER_DIR = "tokenizer"  # OUT/tokenizer: the Qwen3-VL processor folder LeRobot's VLM step loads
EMBODIMENT_TAG = "new_embodiment"  # the tag LeRobot's pack step maps to the model's embodiment slot
VIDEO_PAD = "<|video_pad|>"  # Qwen3-VL's processor looks it up even for images alone
QWEN_VIDEO_PAD_ID = 151_656
# LeRobot 0.6.1's GR00T N1.7 processor steps by registry name: pack (state normalised by min / max,
# embodiment), VLM encode (views, chat template, tokenizer: its config's model_name), unpack + unnormalise
PACK_STEP, VLM_STEP = "groot_n1_7_pack_inputs_v1", "groot_n1_7_vlm_encode_v1"
UNPACK_STEP = "groot_action_unpack_unnormalize_v2"
# the tokenizer folder's files LeRobot's processor reads (the rest of a Cosmos-Reason2-2B folder is not needed)
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "preprocessor_config.json", "video_preprocessor_config.json", "special_tokens_map.json")


def lerobot_policy(cfg: Gr00tConfig, n17_config: Mapping[str, Any], features: Mapping[str, Any],
                   out: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(GrootPolicy's config.json, the base folder's and the tokenizer folder's files) for an export
    to `out` (its final, absolute path); `n17_config`: config_json's document with the export's dtype."""
    from safetensors.torch import save

    size = [3, cfg.image_height, cfg.image_width]
    inputs = {cam: {"type": "VISUAL", "shape": size} for cam in features["cameras"]}
    inputs["observation.state"] = {"type": "STATE", "shape": [int(features["state_dim"])]}
    policy = {"type": "groot", "n_obs_steps": 1, "input_features": inputs,
              "output_features": {"action": {"type": "ACTION", "shape": [int(features["action_dim"])]}},
              "device": "cpu", "use_amp": False, "push_to_hub": False, "chunk_size": cfg.horizon,
              "n_action_steps": cfg.horizon, "max_state_dim": cfg.state_dim, "max_action_dim": cfg.action_dim,
              # the run's data.norm as LeRobot's modes (its GR00T steps normalise by min / max whatever it says)
              "normalization_mapping": dict(n17_config["normalization_mapping"]),
              "base_model_path": str(out / BASE_DIR), "action_decode_transform": None,
              "embodiment_tag": EMBODIMENT_TAG, "tune_llm": False, "tune_visual": False,
              "tune_top_llm_layers": cfg.lm_trained, "num_inference_timesteps": SAMPLE_STEPS,
              "use_bf16": n17_config.get("dtype") == "bfloat16", "model_params_fp32": True,
              "image_size": [cfg.image_height, cfg.image_width]}
    base = {k: v for k, v in n17_config.items() if k != "normalization_mapping"}
    files = {f"{BASE_DIR}/config.json": (json.dumps(base, indent=4) + "\n").encode(),
             f"{BASE_DIR}/model.safetensors": save({})}
    files.update({f"{TOKENIZER_DIR}/{k}": v for k, v in processor_folder(cfg).items()})
    return policy, files


def processor_folder(cfg: Gr00tConfig) -> dict[str, bytes]:
    """The Qwen3-VL processor's files: the run's tokenizer folder's (model.tokenizer) or the builtin
    stand-in's (its tokenizer.json with <|video_pad|> added, a Qwen2Tokenizer config with its chat
    template), and image / video processor configs at the model's shapes where the folder has none."""
    files: dict[str, bytes] = {}
    if cfg.tokenizer:
        folder = Path(cfg.tokenizer)
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError("model.tokenizer", f"{folder}/tokenizer.json: not found (the run's tokenizer, which the "
                              "export carries; export from the run's working directory or put the folder back)")
        files = {name: (folder / name).read_bytes() for name in PROCESSOR_FILES if (folder / name).is_file()}
    else:
        qwen = cfg.image_token_id == QWEN_IDS[SPECIAL.index("<|image_pad|>")]
        tok = QwenChatTokenizer.builtin(tokens_per_image=cfg.tokens_per_image, qwen_ids=qwen).tokenizer
        tok.add_special_tokens([VIDEO_PAD])  # the next free id: 262 (before the model's vocab), or Qwen's
        files["tokenizer.json"] = _with_token_id(tok.to_str(), VIDEO_PAD, QWEN_VIDEO_PAD_ID if qwen else 262)
        files["tokenizer_config.json"] = json.dumps({
            "tokenizer_class": "Qwen2Tokenizer", "pad_token": SPECIAL[0], "eos_token": SPECIAL[2],
            "model_max_length": 1 << 20, "chat_template": BUILTIN_TEMPLATE}, indent=2).encode()
    image = {"patch_size": cfg.patch, "temporal_patch_size": cfg.temporal_patch, "merge_size": cfg.merge,
             "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "do_rescale": True, "rescale_factor": 1 / 255,
             # min / max pixels: the view size itself, so the processor never resizes a view the VLM step made
             "size": {"shortest_edge": cfg.image_height * cfg.image_width,
                      "longest_edge": cfg.image_height * cfg.image_width}}
    files.setdefault("preprocessor_config.json", json.dumps(
        {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor", **image},
        indent=2).encode())
    files.setdefault("video_preprocessor_config.json", json.dumps(
        {"video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor", **image},
        indent=2).encode())
    return files


def _with_token_id(tokenizer_json: str, token: str, token_id: int) -> bytes:
    """tokenizer.json with the added special `token` at `token_id` (tokenizers gives an added token
    the next id after the vocabulary's; Qwen's <|video_pad|> sits at its own)."""
    doc = json.loads(tokenizer_json)
    for added in doc["added_tokens"]:
        if added["content"] == token:
            added["id"] = token_id
    return json.dumps(doc, ensure_ascii=False).encode()


def lerobot_processors(cfg: Gr00tConfig, policy: Mapping[str, Any],
                       tokenizer_name: str | None) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """(the step entries of `policy_preprocessor.json` and `policy_postprocessor.json`, notes): the
    steps LeRobot 0.6.1's `make_groot_pre_post_processors` builds, as its `save_pretrained` writes
    them, set to what this model trained with (module docstring). The pack and unpack steps'
    statistics are written by trainkit/weights/lerobot_processors.py (`min_max_stats`);
    `normalization_mapping` (the run's data.norm, as LeRobot's modes) says whether there are any."""
    normalised = policy["normalization_mapping"]["STATE"] != "IDENTITY"
    cams = [k for k, v in policy["input_features"].items() if v["type"] == "VISUAL"]
    pack = {"state_horizon": 1, "action_horizon": cfg.horizon, "valid_action_horizon": cfg.horizon,
            "video_horizon": None, "max_state_dim": cfg.state_dim, "max_action_dim": cfg.action_dim,
            "language_key": "task", "formalize_language": True, "embodiment_tag": EMBODIMENT_TAG,
            "embodiment_mapping": {EMBODIMENT_TAG: cfg.embodiment}, "normalize_min_max": normalised,
            "state_dropout_prob": 0.0, "clip_outliers": False, "use_percentiles": False,
            "video_modality_keys": [c.removeprefix("observation.images.") for c in cams], "raw_stats": None,
            "modality_config": None}
    # the eval-time view transform trainkit's loader runs (batches.py view_settings): N1.7's centre crop
    # of crop_fraction of each side (LeRobot rounds the size and floors the offset, as datakit does), or
    # none; LeRobot's bicubic resize to the view size is the identity on a view already at it
    crop = eval_crop(cfg)
    vlm = {"model_name": tokenizer_name, "image_crop_size": list(crop) if crop else None,
           "image_target_size": [cfg.image_height, cfg.image_width], "shortest_image_edge": None,
           "crop_fraction": N17_CROP_FRACTION if crop else None, "use_albumentations": False,
           "letter_box_transform": False, "device": policy.get("device") or "cpu"}
    device = {"registry_name": "device_processor", "config": {"device": policy.get("device") or "cpu",
                                                              "float_dtype": None}}
    pre = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
           {"registry_name": "to_batch_processor", "config": {}},
           {"registry_name": PACK_STEP, "config": pack},
           {"registry_name": VLM_STEP, "config": vlm},
           device]
    unpack = {"env_action_dim": int(policy["output_features"]["action"]["shape"][0]),
              "normalize_min_max": normalised, "clip_normalized_action": False,
              "libero_gripper_action": False, "libero_gripper_binarize": True}
    post = [{"registry_name": UNPACK_STEP, "config": unpack},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]
    notes = []
    if not cfg.tokenizer:
        notes.append("the run trained with the builtin byte-level tokenizer (no model.tokenizer): OUT/tokenizer holds "
                     "it, so LeRobot prompts as training did, but it is not Qwen's (a published N1.7 checkpoint's "
                     "backbone reads Qwen's tokens)")
    if cfg.view_transform == "n17":
        cropped = f", centre crop {crop[0]}x{crop[1]}, bicubic back" if crop else ""
        notes.append("LeRobot's VLM step runs N1.7's view transform as trainkit's loader did (bicubic to "
                     f"{cfg.image_height}x{cfg.image_width}{cropped}); on the CPU torchvision's fixed-point uint8 "
                     "bicubic differs from the float kernel trainkit (and torchvision on the GPU) runs by under half a "
                     "level on average")
    else:
        notes.append(f"LeRobot's VLM step resizes a camera frame of another size than {cfg.image_height}x{cfg.image_width} "
                     "bicubic, where trainkit's loader resized it bilinear (antialiased): feed frames at the model's size "
                     "for the views training saw")
    if cfg.random_crop:
        notes.append("the run trained with the crop window at a random place per sample (model.random_crop); LeRobot "
                     "serves with the centre crop, N1.7's evaluation transform")
    if cfg.fixed_len:
        notes.append("the run padded every prompt to a fixed length (model.fixed_len); LeRobot pads to the batch's "
                     "longest, and N1.7's VL self-attention sees the padding, so its actions differ slightly")
    return {"policy_preprocessor": pre, "policy_postprocessor": post}, notes

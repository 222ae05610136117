"""LeRobot's processor pipelines in a weights folder: `policy_preprocessor.json` and
`policy_postprocessor.json` with their steps' state files, as LeRobot 0.6.1's
`DataProcessorPipeline.save_pretrained` writes them, so that `make_pre_post_processors(cfg,
pretrained_path=OUT)` builds from the folder alone the pipeline its policy needs on a raw
observation (images, state, task string).

    files = processor_files(pipelines, policy, stats)   # {"policy_preprocessor.json": b"...", ...}

The format (lerobot/processor/pipeline.py): `{"name": NAME, "steps": [{"registry_name": R,
"config": {...}, "state_file": "NAME_step_I_R.safetensors"}, ...]}`, JSON indented by 2; a state
file only for a step that has state. The family gives the steps (`Weights.lerobot_processors`:
pi05's are `make_pi05_pre_post_processors`'); here the normaliser steps, named but not filled in,
get their config as LeRobot's factory builds it (the normaliser: the policy's input and output
features; the unnormaliser: its output features; the policy's normalization_mapping; eps 1e-8) and
their state: the statistics the run trained with, `observation.state.<stat>` and `action.<stat>`
float32 tensors, the same in both pipelines as LeRobot saves them. tests/trainkit/weights/test_trainkit_export_serving.py
compares these files with the ones LeRobot's own factory and save_pretrained write.
Steps that normalise by min / max alone (`Weights.min_max_steps`: GR00T N1.7's pack and unpack), 2 (x - min) /
(max - min) - 1: their state is the `observation.state.min/max` and `action.min/max` that
reproduce the run's normalisation (`min_max_stats`: quantile q01 / q99, mean_std mean -/+ std).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import torch

Stats = dict[str, dict[str, list[float]]]  # "state" / "action" -> stat name -> values
LEROBOT_KEYS = {"state": "observation.state", "action": "action"}  # trainkit's part -> LeRobot's feature
NORMALIZER, UNNORMALIZER = "normalizer_processor", "unnormalizer_processor"
EPS = 1e-8  # NormalizerProcessorStep's default


def lerobot_stats(stats: Stats) -> dict[str, torch.Tensor]:
    """The statistics as LeRobot's normaliser steps hold them (their state file)."""
    return {f"{LEROBOT_KEYS[part]}.{name}": torch.tensor(values, dtype=torch.float32)
            for part, d in stats.items() if part in LEROBOT_KEYS for name, values in d.items()}


def _normaliser_config(registry: str, policy: Mapping[str, Any]) -> dict[str, Any]:
    features = dict(policy["output_features"]) if registry == UNNORMALIZER else \
        {**policy["input_features"], **policy["output_features"]}
    return {"eps": EPS, "features": features, "norm_map": dict(policy["normalization_mapping"])}


def min_max_stats(stats: Stats, norm: str) -> dict[str, torch.Tensor]:
    """The min / max under which LeRobot's GR00T N1.7 steps' 2 (x - min) / (max - min) - 1 is
    datakit's normalisation `norm` ("quantile" or "mean_std") of state and action."""
    out = {}
    for part in ("state", "action"):
        s = {k: torch.tensor(v, dtype=torch.float64) for k, v in stats[part].items() if k in ("q01", "q99", "mean", "std")}
        lo, hi = (s["q01"], s["q99"]) if norm == "quantile" else (s["mean"] - s["std"], s["mean"] + s["std"])
        out[f"{LEROBOT_KEYS[part]}.min"], out[f"{LEROBOT_KEYS[part]}.max"] = lo.float(), hi.float()
    return out


def processor_files(pipelines: Mapping[str, list[dict[str, Any]]], policy: Mapping[str, Any],
                    stats: Stats, norm: str = "quantile", min_max_steps: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Each pipeline (file stem -> step entries) as `<stem>.json` plus its statistics steps' state
    files; `policy` is the folder's config.json (features, normalization_mapping); `norm`: the run's
    data.norm; `min_max_steps`: the family's steps that normalise by min / max (`Weights.min_max_steps`),
    given the min / max of the run's normalisation."""
    from safetensors.torch import save

    state = save(lerobot_stats(stats))
    files: dict[str, bytes] = {}
    for name, steps in pipelines.items():
        entries = []
        for i, step in enumerate(steps):
            registry = step["registry_name"]
            state_file = f"{re.sub(r'[^a-zA-Z0-9_]', '_', name.lower())}_step_{i}_{registry}.safetensors"
            if registry in (NORMALIZER, UNNORMALIZER) and "config" not in step:
                step = {"registry_name": registry, "config": _normaliser_config(registry, policy),
                        "state_file": state_file}
                files[state_file] = state
            elif registry in min_max_steps and step["config"]["normalize_min_max"]:
                step = {**step, "state_file": state_file}
                files[state_file] = save(min_max_stats(stats, norm))
            entries.append(step)
        files[f"{name}.json"] = json.dumps({"name": name, "steps": entries}, indent=2).encode()
    return files


def statistics_only(stats: Stats, mode: str) -> dict[str, bytes]:
    """A folder's statistics as LeRobot's normaliser and unnormaliser alone (LeRobot `mode`:
    "QUANTILES", "MEAN_STD", "IDENTITY" for state and action): what `data.norm_from =
    "checkpoint"` reads, without the rest of a policy's pipeline."""
    features = {LEROBOT_KEYS[p]: {"type": "STATE" if p == "state" else "ACTION", "shape": [len(stats[p]["mean"])]}
                for p in LEROBOT_KEYS if stats.get(p, {}).get("mean")}
    policy = {"input_features": {k: v for k, v in features.items() if k != "action"},
              "output_features": {k: v for k, v in features.items() if k == "action"},
              "normalization_mapping": {"STATE": mode, "ACTION": mode, "VISUAL": "IDENTITY"}}
    return processor_files({"policy_preprocessor": [{"registry_name": NORMALIZER}],
                            "policy_postprocessor": [{"registry_name": UNNORMALIZER}]}, policy, stats)

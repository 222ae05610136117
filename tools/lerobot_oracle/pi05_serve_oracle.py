"""LeRobot 0.6.1 serving a `trainkit export --format lerobot` folder, as a LeRobot user would (run in
the lerobot venv; tests/trainkit/weights/test_trainkit_export_serving.py drives it).

    $LEROBOT_VENV/bin/python tools/lerobot_oracle/pi05_serve_oracle.py OBS.npz OUT.npz EXPORT [EXPORT ...]
        [--reference DIR] [--prompts PROMPTS.json]

For each EXPORT, from the folder alone: `PreTrainedConfig.from_pretrained`, `PI05Policy.from_pretrained`
(strict; the tiny shapes patched in as pi05_oracle.py does), `make_pre_post_processors(cfg,
pretrained_path=EXPORT)`, then the raw observation of OBS.npz (`image/<camera>`: uint8 (H, W, 3) as a
robot gives it; `state`: float32 (D,); `task`: the task string) through LeRobot's
`prepare_observation_for_inference`, the preprocessor, `policy.select_action` n_action_steps times
(the serving loop: one chunk, then its queue) and the postprocessor on each action. The flow noise
is OBS.npz's `noise`: `PI05Pytorch.sample_noise` is replaced by it (the only random draw of
`select_action`). OUT.npz gets per export `<i>/actions` (B, n_action_steps, A), `<i>/tokens`,
`<i>/token_mask` and `<i>/state` (the normalised state) as the preprocessor made them.
`--reference DIR`: LeRobot's own `make_pi05_pre_post_processors(cfg, dataset_stats)` for the first
export's config and OBS.npz's `stats/<feature>.<stat>`, saved with `save_pretrained` into DIR (its
tokenizer step loads the export's tokenizer/: the Hub's PaliGemma is not reachable offline).
`--prompts`: a JSON list of strings, tokenized by the first export's tokenizer/ through
`AutoTokenizer` as LeRobot's tokenizer step calls it, into `prompts/ids` (a JSON file beside OUT).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def serve(export: str, obs: dict, prefix: str, out: dict) -> None:
    import numpy as np
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.utils import prepare_observation_for_inference
    from pi05_oracle import from_pretrained

    cfg = PreTrainedConfig.from_pretrained(export)
    policy = from_pretrained(export)
    pre, post = make_pre_post_processors(cfg, pretrained_path=export)
    noise = torch.from_numpy(obs["noise"])
    policy.model.sample_noise = lambda shape, device: noise.to(device)
    raw = {k.removeprefix("image/"): np.array(v) for k, v in obs.items() if k.startswith("image/")}
    raw["observation.state"] = np.array(obs["state"])
    batch = pre(prepare_observation_for_inference(raw, torch.device("cpu"), task=str(obs["task"])))
    policy.reset()
    with torch.no_grad():
        actions = [post(policy.select_action(batch)) for _ in range(cfg.n_action_steps)]
    out[f"{prefix}/actions"] = torch.stack(actions, dim=1).numpy()
    out[f"{prefix}/tokens"] = batch["observation.language.tokens"].numpy()
    out[f"{prefix}/token_mask"] = batch["observation.language.attention_mask"].numpy()
    out[f"{prefix}/state"] = batch["observation.state"].numpy()


def reference(export: str, obs: dict, folder: str) -> None:
    """LeRobot's own pi05 pipelines for the export's config, saved as LeRobot saves them."""
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors
    from lerobot.processor import tokenizer_processor
    from transformers import AutoTokenizer

    local = os.path.join(export, "tokenizer")
    tokenizer_processor.AutoTokenizer = type("Local", (), {"from_pretrained": staticmethod(
        lambda name, **kw: AutoTokenizer.from_pretrained(local, **kw))})
    stats: dict = {}
    for key, value in obs.items():
        if key.startswith("stats/"):
            feature, _, stat = key.removeprefix("stats/").rpartition(".")
            stats.setdefault(feature, {})[stat] = torch.from_numpy(value)
    pre, post = make_pi05_pre_post_processors(PreTrainedConfig.from_pretrained(export), dataset_stats=stats)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)


def tokenize(export: str, prompts_file: str, out_file: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(export, "tokenizer"))
    with open(prompts_file) as f:
        prompts = json.load(f)
    enc = tok(prompts, max_length=10_000, truncation=True, padding="longest", padding_side="right")
    ids = [[i for i, m in zip(row, mask) if m] for row, mask in zip(enc["input_ids"], enc["attention_mask"])]
    with open(out_file, "w") as f:
        json.dump(ids, f)


def main() -> None:
    import numpy as np
    from pi05_oracle import patch_tiny

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("obs")
    p.add_argument("out")
    p.add_argument("exports", nargs="+")
    p.add_argument("--reference", default=None, metavar="DIR")
    p.add_argument("--prompts", default=None, metavar="JSON")
    args = p.parse_args()
    obs = dict(np.load(args.obs))
    patch_tiny()
    out: dict = {}
    for i, export in enumerate(args.exports):
        serve(export, obs, str(i), out)
    np.savez(args.out, **out)
    if args.prompts:
        tokenize(args.exports[0], args.prompts, args.out + ".prompts.json")
    if args.reference:
        reference(args.exports[0], obs, args.reference)


if __name__ == "__main__":
    main()

"""What LeRobot 0.6.1 really serves from an export folder: its policy's `state_dict()` compared with
the folder's `model.safetensors`, tensor by tensor (run in the lerobot venv, offline;
tests/trainkit/weights/test_export_servable.py drives it).

    $LEROBOT_VENV/bin/python tools/lerobot_oracle/served_state_oracle.py pi05|groot OUT.json EXPORT[,REFERENCE] ...

LeRobot's `from_pretrained` prints "Could not load state dict ... size mismatch" (Pi0.5) or lists
missing keys and returns the randomly initialised policy, so its "loaded" message is not trusted
here: for each EXPORT the policy is built as a user builds it (`PreTrainedConfig.from_pretrained`,
`PI05Policy` / `GrootPolicy.from_pretrained`; the tiny shapes patched in as pi05_oracle.py and
groot_serve_oracle.py do, which README.txt of a tiny export asks for; gr00t's backbone config is the
JSON file $QWEN_CONFIG names), then every tensor of the
file must be in the policy's state dict (under the key LeRobot gives it) with equal values, and
every tensor of the state dict must come from the file (or be tied to one that does). For pi05 the processors are built from the
folder too (`make_pre_post_processors`: the tokenizer from the export's own tokenizer/, offline).
`,REFERENCE`: compare with that folder's model.safetensors instead (a positive control: serve a
folder with one tensor changed, compare with the original). OUT.json gets per argument {"equal": n, "differ": [keys], "missing_in_policy": [keys],
"not_from_file": [keys], "processors": bool}.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def policy_of(family: str, export: str):
    import contextlib
    import io

    from lerobot.configs.policies import PreTrainedConfig

    cfg = PreTrainedConfig.from_pretrained(export)
    with contextlib.redirect_stdout(io.StringIO()):  # its messages are not the verdict
        if family == "pi05":
            from lerobot.policies.pi05.modeling_pi05 import PI05Policy

            return cfg, PI05Policy.from_pretrained(export, config=cfg)
        from lerobot.policies.groot.modeling_groot import GrootPolicy

        return cfg, GrootPolicy.from_pretrained(export, config=cfg)


def compare(family: str, export: str, reference: str) -> dict:
    import torch
    from safetensors.torch import load_file

    cfg, policy = policy_of(family, export)
    served = policy.state_dict()
    file = load_file(os.path.join(reference, "model.safetensors"))
    result = {"equal": 0, "differ": [], "missing_in_policy": [], "not_from_file": [], "processors": False}
    for key, t in file.items():
        if key not in served:
            result["missing_in_policy"].append(key)
        elif served[key].shape != t.shape or not torch.equal(served[key].to(t.dtype), t):
            result["differ"].append(key)
        else:
            result["equal"] += 1
    # a key the file lacks is served from it only when tied to one it holds (GR00T's LM head: its embedding)
    loaded = {served[k].data_ptr() for k in file if k in served}
    result["not_from_file"] = sorted(k for k in set(served) - set(file) if served[k].data_ptr() not in loaded)
    if family == "pi05":
        from lerobot.policies.factory import make_pre_post_processors

        make_pre_post_processors(cfg, pretrained_path=export)  # offline: the tokenizer is the folder's own
        result["processors"] = True
    return result


def main() -> None:
    family, out, exports = sys.argv[1], sys.argv[2], sys.argv[3:]
    if family == "pi05":
        from pi05_oracle import patch_tiny

        patch_tiny()
    else:  # the backbone LeRobot hard-codes (Cosmos-Reason2-2B) replaced by QWEN_CONFIG's, as groot_serve_oracle.py does
        from transformers import Qwen3VLConfig

        import lerobot.policies.groot.groot_n1_7 as n17

        with open(os.environ["QWEN_CONFIG"]) as f:
            qwen = json.load(f)
        n17._cosmos_reason2_qwen3_vl_config = lambda: Qwen3VLConfig(**qwen)
        n17._register_with_transformers()
    with open(out, "w") as f:
        json.dump({arg: compare(family, *(arg.split(",") + [arg])[:2]) for arg in exports}, f)


if __name__ == "__main__":
    main()

"""LeRobot 0.6.1's Pi0.5 sampler (`PI05Pytorch.sample_actions`: its prefix KV cache and
`euler_integrate`) as the oracle of trainkit's `pi05.sample_actions` (run in the lerobot venv).

    $LEROBOT_VENV/bin/python tools/lerobot_oracle/pi05_sample_oracle.py CKPT IN.npz OUT.npz

CKPT: a `trainkit export --format lerobot` of a tiny run (`pi05_oracle.TINY` widths), loaded with
`PI05Policy.from_pretrained`, refused unless every key loads. IN.npz: one model batch as trainkit
built it (images (B, S, 3, H, W) normalised, image_mask (B, S), tokens, token_mask) and the flow
noise (B, horizon, 32). OUT.npz: for each `steps/<n>` of IN's `steps` list, the action chunk
(B, horizon, 32) of `sample_actions(..., noise=noise, num_steps=n)`, and `negated` with -noise
at the first of those step counts (a test's positive control).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import numpy as np
    import torch

    from pi05_oracle import from_pretrained, patch_tiny

    ckpt, src, dst = sys.argv[1:4]
    patch_tiny()
    policy = from_pretrained(ckpt).eval()
    x = {k: torch.from_numpy(v) for k, v in np.load(src).items()}
    images = [x["images"][:, i] for i in range(x["images"].shape[1])]
    masks = [x["image_mask"][:, i] for i in range(x["image_mask"].shape[1])]
    out = {}
    with torch.no_grad():
        for n in x["steps"].tolist():
            actions = policy.model.sample_actions(images, masks, x["tokens"], x["token_mask"], noise=x["noise"].clone(),
                                                  num_steps=int(n))
            out[f"steps/{n}"] = actions.numpy()
        first = int(x["steps"][0])
        out["negated"] = policy.model.sample_actions(images, masks, x["tokens"], x["token_mask"], noise=-x["noise"],
                                                     num_steps=first).numpy()
    np.savez(dst, **out)


if __name__ == "__main__":
    main()

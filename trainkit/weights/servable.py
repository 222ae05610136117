"""An export LeRobot would load with random weights is refused before it is written.

    problem = servable_problem(tensors, build)   # None, or one line naming the first tensor and the setting

LeRobot 0.6.1's `from_pretrained` meets a tensor of another shape than the model it built from
config.json with a printed warning ("Could not load state dict ... size mismatch"; GR00T's: missing
or unexpected keys) and returns the randomly initialised policy, whose `select_action` gives finite
actions: a serve test that checks for finite actions passes. So `trainkit export --format lerobot`
compares every tensor it is about to write, key and shape, with the state dict the family computes
LeRobot builds from the exported config.json (`Weights.lerobot_shapes`: pi05/lerobot_shapes.py,
gr00t/lerobot_shapes.py), without LeRobot installed, and refuses the first difference in one line
naming the tensor, both shapes and the setting that decides it. Where LeRobot builds the shapes
only after a patch (tiny widths), the family's `patch_note` goes into README.txt.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from trainkit.models.family import LeRobotBuild

CONSEQUENCE = "LeRobot 0.6.1 would load this export only with a size-mismatch warning and serve random weights"


def servable_problem(tensors: Mapping[str, torch.Tensor], build: LeRobotBuild) -> str | None:
    """The first tensor (in LeRobot's module order, then the export's extra keys sorted) whose key
    or shape differs from LeRobot's build, as one line; None when every tensor matches."""
    for key, want in build.shapes.items():
        setting = build.settings.get(key) or "the model's widths"
        if key not in tensors:
            return f"{key}: LeRobot 0.6.1 builds it {list(want)} from the exported config.json and the export lacks it ({setting}); {CONSEQUENCE}"
        have = tuple(tensors[key].shape)
        if have != tuple(want):
            return (f"{key} is {list(have)}, LeRobot 0.6.1 builds {list(want)} from the exported config.json: "
                    f"set {setting} and train again; {CONSEQUENCE}")
    extra = sorted(set(tensors) - set(build.shapes))
    if extra:
        return (f"{extra[0]} is not among the tensors LeRobot 0.6.1 builds from the exported config.json "
                f"({len(extra)} such); {CONSEQUENCE}")
    return None

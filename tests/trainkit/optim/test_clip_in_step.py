"""optim.clip_in_step (trainkit/optim/clip.py): the clip inside fused AdamW's step against torch's
in-place clip_grad_norm_, on tiny CPU runs.

Oracle: the same run with the switch off (today's path). A clip that binds every step
(train.grad_clip small) moves the losses by rounding only (1e-6 relative); a clip that never binds
gives the same losses bit for bit. AdamW is nearly blind to a gradient's scale (m / sqrt(v)), so
the runs use optim.eps = 1 (the update then scales with the gradient), and the positive control,
the same run without clipping, must differ by far more than the tolerance: a clip left out of the
step would not pass. With FSDP (one process, block units) as without.
"""
import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import tiny_config

from trainkit.errors import ConfigError
from trainkit.train import run

REL = 1e-6
COMMON = ("train.steps=4", "output.log_every=1", "optim.fused=true", "optim.schedule=constant", "optim.lr=1e-2",
          "optim.eps=1.0",
          "train.micro_batch=4")


def _losses(shards, out, *sets):
    return run(tiny_config(shards, out, *COMMON, *sets)).losses


@pytest.mark.parametrize("fsdp", ["none", "block"])
def test_clip_in_step_matches_the_in_place_clip(shards_rgb, tmp_path, fsdp):  # noqa: F811
    base = (f"parallel.fsdp={fsdp}", "train.grad_clip=0.01")  # binds every step (the tiny grad norms are ~1)
    off = _losses(shards_rgb, tmp_path / "off", *base)
    on = _losses(shards_rgb, tmp_path / "on", *base, "optim.clip_in_step=true")
    assert len(off) == 4 and off.keys() == on.keys()
    assert all(abs(on[k] - off[k]) <= REL * abs(off[k]) for k in off), (off, on)
    unclipped = _losses(shards_rgb, tmp_path / "unclipped", f"parallel.fsdp={fsdp}", "train.grad_clip=0")
    assert max(abs(unclipped[k] - off[k]) / abs(off[k]) for k in list(off)[1:]) > 100 * REL


def test_a_clip_that_never_binds_changes_nothing(shards_rgb, tmp_path):  # noqa: F811
    off = _losses(shards_rgb, tmp_path / "off", "parallel.fsdp=none", "train.grad_clip=1e6")
    on = _losses(shards_rgb, tmp_path / "on", "parallel.fsdp=none", "train.grad_clip=1e6", "optim.clip_in_step=true")
    assert on == off


def test_clip_in_step_needs_fused_adamw(shards_rgb, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="optim.clip_in_step"):
        run(tiny_config(shards_rgb, tmp_path / "x", *COMMON, "optim.fused=false", "optim.clip_in_step=true"))

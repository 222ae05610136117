"""Every shipped preset runs (issue 35, item 6): no preset can ship refused.

Each file `trainkit configs` lists (`preset_names()`, the same listing) goes through
1. the checks `trainkit run` applies to the settings, at the preset's own shapes: the config load
   (unknown keys, types, choices), the model built on the meta device (no memory, full size included),
   then `check_settings` (batch split, held-out episodes, the non-finite check, and `check_parallel`:
   block lists, recompute of frozen lists, CUDA graphs) as on a GPU host (`cuda=True`);
2. a 1-step CPU run through `trainkit.train.run` at tiny shapes: `model.preset=tiny` and the switches
   this CPU machine cannot take turned off (compile: minutes of CPU inductor; CUDA graphs and FP8:
   CUDA only), everything else as shipped (FSDP mode and groups, recompute, frozen handling, dtypes,
   EMA, norms, slots, attention kind), on a dataset the family reads (pi05 / GR00T: the loader's
   3-camera RGB shards; DreamZero: its 3-camera DROID-like shards).
Before the fix gr00t_baseline.toml failed 1: `parallel.ac_stride.lm_layers: a frozen block list runs
under no_grad and keeps no activation` (n17 trains no LLM layer).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.configs import preset_names, resolve_config

pytestmark = pytest.mark.timeout(300)

# what this CPU cannot run or would take minutes over; everything else stays as shipped
CPU = ("parallel.compile=false", "parallel.cuda_graphs=false", "parallel.float8_modules=[]")


def _settings_checked(name: str, shards: Path, out: Path) -> None:
    from trainkit.config import load_config
    from trainkit.models import build_model
    from trainkit.train import check_settings
    from trainkit.weights.shape import with_weights_shape

    cfg = load_config(name, [f"data.shards={shards}", f"output.dir={out}"])
    cfg, _ = with_weights_shape(cfg)
    with torch.device("meta"):
        model = build_model(cfg.model.family, cfg.model.preset, cfg.model.overrides)
    check_settings(cfg, model, world_size=1, cuda=True)


def _data(name: str, request) -> Path:
    return request.getfixturevalue("shards_3cam" if name.startswith("dreamzero") else "shards_rgb")


def test_the_listing_is_every_file_of_the_folder():
    names = preset_names()
    assert len(names) >= 10 and all(resolve_config(n).is_file() for n in names), names


@pytest.mark.parametrize("name", preset_names())
def test_a_shipped_preset_passes_the_run_checks_at_its_own_shapes(name, request, tmp_path):
    _settings_checked(name, _data(name, request), tmp_path / "run")


@pytest.mark.parametrize("name", preset_names())
def test_a_shipped_preset_trains_one_step_on_the_cpu_at_tiny_shapes(name, request, tmp_path):
    from trainkit.config import load_config
    from trainkit.train import run

    sets = [f"data.shards={_data(name, request)}", f"output.dir={tmp_path / 'run'}", "model.preset=tiny", *CPU,
            "train.steps=1", "train.micro_batch=2", "train.global_batch=0", "data.num_workers=0",
            "output.progress=false", "output.log_every=1", "output.checkpoint_every=0", "output.save_last=false",
            "optim.warmup_steps=0"]
    result = run(load_config(name, sets))
    assert list(result.losses) == [0] and torch.isfinite(torch.tensor(result.losses[0])), result.losses


def test_the_check_refuses_what_the_trainer_refuses(shards_rgb, tmp_path):  # noqa: F811
    """The positive control: a frozen block list under recompute (what gr00t_baseline shipped with)."""
    from trainkit.errors import ConfigError

    bad = tmp_path / "bad.toml"
    bad.write_text(resolve_config("gr00t_tiny").read_text().replace(
        "ac_stride = { dit_blocks = 2 }", "ac_stride = { dit_blocks = 2, vision_blocks = 1 }"))
    with pytest.raises(ConfigError, match="parallel.ac_stride.vision_blocks: a frozen block list"):
        _settings_checked(str(bad), shards_rgb, tmp_path / "run")

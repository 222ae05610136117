"""A LoaderConfig as a TOML file (`loader_config_to_toml` / `loader_config_from_toml`) and `datakit
plan --loader-config`: every field survives the round trip (oracle: dataclass equality, and the
file read back with stock tomllib), a bad file is refused in one line naming the file and the key
(exit 2), flags override the file, and `--preset` is gone (the presets are trainkit's)."""
from __future__ import annotations

import json
import tomllib
from types import SimpleNamespace

import pytest

from loader_fixtures import CAMS, shards_rgb  # noqa: F401 - session fixture

from datakit.cli import main
from datakit.errors import ConfigError
from datakit.loader import LoaderConfig, loader_config_from_toml, loader_config_to_toml
from datakit.loader.slots import slot_map

CONFIGS = [
    LoaderConfig(),
    LoaderConfig(frame_offsets=(0,), action_horizon=50, norm="quantile", slots=("a", None, "b"), batch_size=40,
                 episodes=(7, 2, 3), seed=3, shuffle="shard_block", block_size=64, world_size=4, rank=3,
                 epoch_batch=320, image_dtype="float32", resize=(224, 224), crop=(200, 200), random_crop=True, crop_resize=True,
                 crop_per_sample=True,
                 colour_jitter=0.25, image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225)),
    LoaderConfig(frame_offsets=tuple(range(-32, 1)), state_offsets=(-1, 0), action_horizon=32, tile="wrist_top",
                 slots=("w", "e1", "e2"), prune_slots=False, camera_offsets={"w": (-8, -4, 0)}, boundary="skip"),
    LoaderConfig(tile="wrist_top", slots=(), prune_slots=False),  # the views: the index's 3 cameras
    LoaderConfig(cache_dir='/nvme/cache "x"', cache_bytes=1 << 40, storage_options={"anon": True, "client_kwargs":
                 {"endpoint_url": "http://127.0.0.1:9000"}}, verify="sha256", on_error="skip", max_open_shards=8,
                 num_workers=6, prefetch_factor=4, worker_buffers=8, lend_batches=False, register_ring=False,
                 pin_memory=False, drop_last=False, coalesce_gap=0),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_every_field_survives_the_round_trip(cfg, tmp_path):
    path = tmp_path / "loader.toml"
    path.write_text(loader_config_to_toml(cfg, "what made it\nand how"))
    assert loader_config_from_toml(path) == cfg
    table = tomllib.loads(path.read_text())["loader"]  # stock TOML: one [loader] table, None left out
    assert set(table) == {k for k, v in vars(cfg).items() if v is not None}
    assert table["slots"] == ["" if s is None else s for s in cfg.slots]
    assert path.read_text().startswith("# what made it\n# and how\n[loader]\n")


def test_overrides_beat_the_file_and_defaults_fill_what_it_leaves(tmp_path):
    path = tmp_path / "loader.toml"
    path.write_text('action_horizon = 50\nbatch_size = 8\n')  # top-level keys are read too
    cfg = loader_config_from_toml(path, defaults={"num_workers": 3, "batch_size": 1}, batch_size=16, seed=None)
    assert (cfg.action_horizon, cfg.batch_size, cfg.num_workers, cfg.seed) == (50, 16, 3, 0)


@pytest.mark.parametrize("text, said", [
    ("[loader]\nbatch_sise = 4\n", "batch_sise: not a LoaderConfig field"),
    ("[loader]\nbatch_size = \"4\"\n", "batch_size: expected an integer, got '4'"),
    ("[loader]\nprune_slots = 1\n", "prune_slots: expected true or false, got 1"),
    ("[loader]\nframe_offsets = 0\n", "frame_offsets: expected an array, got 0"),
    ("[loader]\nresize = [224]\n", "resize: expected an array of 2 values, got [224]"),
    ("[loader]\nslots = [\"a\", 3]\n", "slots: expected a string, got 3"),
    ("[loader]\ncamera_offsets = [1]\n", "camera_offsets: expected a table, got [1]"),
    ("[loader]\nshuffle = \"randon\"\n", "shuffle='randon' is not one of random, shard_block, sequential"),
    ("[loader]\nframe_offsets = [0, -1]\n", "frame_offsets must be strictly increasing"),
    ("[loader\n", "not valid TOML"),
])
def test_a_bad_file_is_one_error_naming_the_file_and_the_key(text, said, tmp_path):
    path = tmp_path / "loader.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        loader_config_from_toml(path)
    assert str(err.value).startswith(f"{path}: ") and said in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="loader config file not found"):
        loader_config_from_toml(tmp_path / "missing.toml")


def test_tiling_with_no_slots_takes_the_index_cameras_when_they_are_three():
    def index(*cams):
        return SimpleNamespace(cameras={c: None for c in cams},
                               episodes=[SimpleNamespace(camera_status={c: "real" for c in cams})])

    assert slot_map(index("w", "e1", "e2"), (), "wrist_top").cameras == ("w", "e1", "e2")
    with pytest.raises(ValueError, match=r"tile='wrist_top' takes 3 views; slots is empty and the index has 2"):
        slot_map(index("w", "e1"), (), "wrist_top")


def _plan(capsys, *args) -> tuple[int, dict | None, str]:
    rc = main(["plan", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if rc == 0 else None, err


def test_plan_reads_the_loader_config_and_flags_override_it(shards_rgb, capsys, tmp_path):  # noqa: F811
    path = tmp_path / "loader.toml"
    path.write_text(loader_config_to_toml(LoaderConfig(frame_offsets=(-2, 0), action_horizon=10, batch_size=4,
                                                       slots=(CAMS[0], None), prune_slots=False)))
    rc, doc, _ = _plan(capsys, shards_rgb, "--samples-per-s", 100, "--loader-config", path)
    frame = json.loads((shards_rgb / "index.json").read_text())["cameras"][CAMS[0]]["frame_bytes"]
    assert rc == 0 and doc["plan"]["batch_size"] == 4
    assert doc["plan"]["h2d_image_bytes_per_step_uint8"] == 4 * 2 * 2 * frame  # 2 slots kept, 2 frames each
    rc, doc, _ = _plan(capsys, shards_rgb, "--samples-per-s", 100, "--loader-config", path, "--batch-size", 8,
                       "--frame-offsets", "0")
    assert rc == 0 and doc["plan"]["batch_size"] == 8
    assert doc["plan"]["h2d_image_bytes_per_step_uint8"] == 8 * 2 * 1 * frame


def test_plan_refuses_a_bad_loader_config_in_one_line(shards_rgb, capsys, tmp_path):  # noqa: F811
    path = tmp_path / "loader.toml"
    path.write_text("[loader]\naction_horizon = 0\n")
    rc, _, err = _plan(capsys, shards_rgb, "--samples-per-s", 100, "--loader-config", path)
    assert rc == 2 and err == f"datakit plan: error: {path}: action_horizon must be >= 1, got 0\n"
    path.write_text("[loader]\nhorizon = 50\n")
    rc, _, err = _plan(capsys, shards_rgb, "--samples-per-s", 100, "--loader-config", path)
    assert rc == 2 and err.startswith(f"datakit plan: error: {path}: horizon: not a LoaderConfig field")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(shards_rgb), "--samples-per-s", "100", "--preset", "pi05"])
    assert exit_.value.code == 2 and "unrecognized arguments: --preset" in capsys.readouterr().err

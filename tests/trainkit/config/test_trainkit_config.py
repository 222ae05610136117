"""trainkit config: TOML -> dataclass tree, dotted overrides with type conversion, strict errors.

Oracle: the TOML text itself (tomllib) and hand-written expected values."""
import tomllib
from pathlib import Path

import pytest

from trainkit.config import REQUIRED, load_config
from trainkit.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "trainkit" / "configs"
BASE = ["data.shards=/d", "train.steps=3", "train.seed=1", "output.dir=/o", "model.preset=tiny"]


@pytest.mark.parametrize("name", ["pi05_tiny", "pi05_baseline", "pi05_optimised", "gr00t_tiny", "gr00t_baseline",
                                  "gr00t_optimised"])
def test_shipped_configs_load_and_match_their_toml(name):
    path = CONFIGS / f"{name}.toml"
    raw = tomllib.loads(path.read_text())
    cfg = load_config(path)
    for section, values in raw.items():
        for key, value in values.items():
            part = getattr(cfg, section)
            # a [model] key that is a field of the family's config goes to model.overrides
            got = part.overrides[key] if section == "model" and not hasattr(part, key) else getattr(part, key)
            assert got == value or (isinstance(value, int) and got == float(value)), (section, key)


def test_overrides_are_converted_to_the_field_type():
    cfg = load_config(None, [*BASE, "optim.lr=1", "parallel.compile=true", "parallel.group.vision_blocks=4",
                             'data.slots=["top", ""]', "output.dir=runs/x y", "parallel.ac_stride={lm_layers = 2}"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.parallel.compile is True
    assert cfg.parallel.group == {"vision_blocks": 4}
    assert cfg.parallel.ac_stride == {"lm_layers": 2}
    assert cfg.data.slots == ["top", ""]
    assert cfg.output.dir == "runs/x y" and cfg.train.steps == 3 and cfg.model.preset == "tiny"


def test_override_wins_over_the_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[train]\nsteps = 5\nseed = 2\n[model]\npreset = "tiny"\n[data]\nshards = "/d"\n[output]\ndir = "/o"\n')
    assert load_config(f).train.steps == 5
    assert load_config(f, ["train.steps=9"]).train.steps == 9


@pytest.mark.parametrize("override, key", [
    ("train.stepz=3", "train.stepz"),              # unknown key
    ("trian.steps=3", "trian"),                    # unknown section
    ("parallel.compile=yes", "parallel.compile"),  # wrong type: bool
    ("train.steps=1.5", "train.steps"),            # wrong type: int
    ("train.steps=true", "train.steps"),           # a bool is not an int
    ("optim.lr=abc", "optim.lr"),                  # wrong type: float
    ("parallel.group.vision_blocks=x", "parallel.group.vision_blocks"),
    ("parallel.fsdp=sometimes", "parallel.fsdp"),  # not one of the choices
    ("data.slots=3", "data.slots"),                # not a list
    ("train", "train"),                            # no '='
])
def test_bad_overrides_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*BASE, override])
    assert str(err.value).startswith(key), str(err.value)


def test_unknown_key_in_the_file_is_named(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[parallel]\nfsdp = 'block'\nprefetchh = true\n")
    with pytest.raises(ConfigError, match=r"^parallel\.prefetchh: unknown key"):
        load_config(f, BASE)


@pytest.mark.parametrize("missing", REQUIRED)
def test_each_required_key_is_required(missing):
    with pytest.raises(ConfigError, match=f"^{missing}: required"):
        load_config(None, [o for o in BASE if not o.startswith(missing + "=")])


def test_bad_toml_names_the_file(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("[train\nsteps = 3\n")
    with pytest.raises(ConfigError, match="broken.toml: not valid TOML"):
        load_config(f, BASE)


# Values that parse but cannot train (issue 14, items 8 and 13): each is refused naming its key.
@pytest.mark.parametrize("override, key", [
    ("optim.lr=nan", "optim.lr"),
    ("optim.lr=inf", "optim.lr"),
    ("optim.lr=-1e-4", "optim.lr"),
    ("optim.lr=0", "optim.lr"),
    ("optim.weight_decay=nan", "optim.weight_decay"),
    ("optim.weight_decay=-0.1", "optim.weight_decay"),
    ("optim.betas=[1.5, 0.9]", "optim.betas"),
    ("optim.betas=[0.9, nan]", "optim.betas"),
    ("optim.betas=[-0.1, 0.9]", "optim.betas"),
    ("optim.eps=-1", "optim.eps"),
    ("optim.eps=0", "optim.eps"),
    ("optim.min_lr_ratio=-5", "optim.min_lr_ratio"),  # a negative lr: gradient ascent
    ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio"),
    ("optim.min_lr_ratio=nan", "optim.min_lr_ratio"),
    ("optim.warmup_steps=-5", "optim.warmup_steps"),
    ("train.grad_clip=nan", "train.grad_clip"),
    ("train.grad_clip=-1", "train.grad_clip"),
    ("train.grad_clip=inf", "train.grad_clip"),
    ("train.on_nonfinite=ignore", "train.on_nonfinite"),
    ("train.micro_batch=0", "train.micro_batch"),
    ("train.global_batch=-4", "train.global_batch"),
    ("data.shuffle=bogus", "data.shuffle"),
    ("data.norm=bogus", "data.norm"),
    ("data.shuffle=3", "data.shuffle"),
    ("output.checkpoint_every=-1", "output.checkpoint_every"),
    ("output.profile_steps=-1", "output.profile_steps"),
    ("output.log_every=0", "output.log_every"),
    ("output.keep_checkpoints=-1", "output.keep_checkpoints"),
    ("train.ema_decay=1", "train.ema_decay"),  # an average that never moves
    ("train.ema_decay=-0.5", "train.ema_decay"),
    ("train.ema_decay=nan", "train.ema_decay"),
    ("train.eval_every=-1", "train.eval_every"),
    ("train.eval_batches=0", "train.eval_batches"),
    ("data.val_fraction=1.0", "data.val_fraction"),  # nothing left to train on
    ("data.val_fraction=nan", "data.val_fraction"),
])
def test_values_that_cannot_train_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*BASE, override])
    assert str(err.value).startswith(f"{key}: "), str(err.value)
    assert "\n" not in str(err.value)


def test_loader_choices_are_datakit_s_own():
    """data.shuffle / data.norm take exactly the words datakit's loader accepts (its constants are the oracle)."""
    import typing

    from datakit.loader.config import NORM_MODES, SHUFFLE_MODES
    from trainkit.config import DataConfig

    hints = typing.get_type_hints(DataConfig)
    assert typing.get_args(hints["shuffle"]) == SHUFFLE_MODES
    assert typing.get_args(hints["norm"]) == NORM_MODES
    for mode in SHUFFLE_MODES:
        assert load_config(None, [*BASE, f"data.shuffle={mode}"]).data.shuffle == mode


# A config path that is no TOML file (issue 25, defect 14): one line naming the file, never a traceback.
def _not_a_config(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "cfg.toml"
    if kind == "directory":
        path.mkdir()
    elif kind == "latin-1":  # a TOML file saved in another encoding
        path.write_bytes("# réglages\n[train]\nsteps = 3\n".encode("latin-1"))
    else:  # binary
        path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.mark.parametrize("kind", ["directory", "latin-1", "binary"])
def test_a_config_path_that_is_not_a_toml_file_is_named(tmp_path, kind):
    path = _not_a_config(tmp_path, kind)
    for call in (lambda: load_config(path, BASE), lambda: load_config(None, BASE, overlay=path)):
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("kind", ["directory", "latin-1"])
@pytest.mark.parametrize("command", ["run", "inspect", "tune", "ladder"])
def test_every_command_names_a_config_path_that_is_not_a_toml_file(tmp_path, capsys, command, kind):
    from trainkit.cli import main

    path = _not_a_config(tmp_path, kind)
    out = tmp_path / "out"
    extra = {"tune": ["--memory-cap", "1", "--out", str(out)], "ladder": ["--out", str(out)]}.get(command, [])
    assert main([command, str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainkit: {path}: ") and err.count("\n") == 1, err
    assert not out.exists()


# Mixtures (issue 27): data.shards = {path = weight}, or [[data.sources]] tables.
MIX = BASE[1:]  # without data.shards
SOURCES = '''
[data]
[[data.sources]]
shards = "data/droid/"
weight = 0.7
slots = ["exterior_1", "", "wrist"]
[[data.sources]]
shards = "s3://bucket/libero"
weight = 0.3
name = "lib"
prompt = "put the bowl on the plate"
'''


def test_a_mixture_table_and_sources_tables_give_the_same_sources(tmp_path):
    f = tmp_path / "mix.toml"
    f.write_text(SOURCES)
    tables = load_config(f, MIX).data
    assert [(s.shards, s.weight, s.label, s.slots, s.prompt) for s in tables.sources] == [
        ("data/droid/", 0.7, "droid", ["exterior_1", "", "wrist"], ""),
        ("s3://bucket/libero", 0.3, "lib", [], "put the bowl on the plate")]
    assert tables.roots == ["data/droid/", "s3://bucket/libero"] and tables.shards == ""
    short = load_config(None, [*MIX, 'data.shards={"data/droid/" = 0.7, "s3://bucket/libero" = 0.3}']).data
    assert [(s.shards, s.weight, s.label) for s in short.sources] == [("data/droid/", 0.7, "droid"),
                                                                      ("s3://bucket/libero", 0.3, "libero")]
    # one folder as before; an override of one form replaces the file's other form
    assert load_config(f, [*MIX, "data.shards=/one"]).data.roots == ["/one"]
    swapped = load_config(None, [*BASE, 'data.sources=[{shards = "/a", weight = 2}]']).data
    assert swapped.shards == "" and swapped.roots == ["/a"]
    assert load_config(None, BASE).data.sources == []


def test_the_loader_gets_each_source_with_its_name_slots_and_prompt(tmp_path):
    from datakit.loader import MixtureSource
    from trainkit.config import loader_sources

    f = tmp_path / "mix.toml"
    f.write_text(SOURCES)
    assert loader_sources(load_config(f, MIX).data) == [
        MixtureSource(root="data/droid/", weight=0.7, name="droid", slots=("exterior_1", None, "wrist")),
        MixtureSource(root="s3://bucket/libero", weight=0.3, name="lib", prompt="put the bowl on the plate")]
    assert loader_sources(load_config(None, BASE).data) == []


@pytest.mark.parametrize("toml, overrides, message", [
    ('[data]\nshards = "/d"\n[[data.sources]]\nshards = "/a"\nweight = 1\n', [],
     "data.sources: set data.shards or [[data.sources]], not both"),
    ("", ['data.shards={"/a" = 0.5, "/b" = 0}'], "data.shards./b: weight must be a number > 0"),
    ("", ['data.shards={"/a" = -1}'], "data.shards./a: weight must be a number > 0"),
    ("", ['data.shards={"/a" = "x"}'], "data.shards./a: expected float"),
    ("", ["data.shards={}"], "data.shards: an empty table"),
    ('[data]\n[[data.sources]]\nshards = "/a"\nweight = -0.5\n', [], "data.sources[0]: weight must be a number > 0"),
    ('[data]\n[[data.sources]]\nshards = "/a"\n', [], "data.sources[0]: weight must be a number > 0"),
    ('[data]\n[[data.sources]]\nweight = 1\n', [], "data.sources[0]: shards is required"),
    ('[data.sources]\nshards = "/a"\nweight = 1\n', [], "data.sources: expected [[data.sources]] tables"),
    ('[data]\n[[data.sources]]\nshards = "/a"\nweight = 1\ncameras = []\n', [],
     "data.sources[0].cameras: unknown key 'cameras'"),
    ('[data]\n[[data.sources]]\nshards = "/x/droid"\nweight = 1\n[[data.sources]]\nshards = "/y/droid/"\nweight = 1\n',
     [], "data.sources: two sources are named 'droid' (/x/droid, /y/droid/)"),
    ('[data]\n[[data.sources]]\nshards = "/a"\nweight = 1\nname = "n"\n[[data.sources]]\nshards = "/b"\n'
     'weight = 1\nname = "n"\n', [], "data.sources: two sources are named 'n'"),
    ("", ['data.shards={"/a" = 1}', "data.val_episodes=[2]"], "data.val_episodes: a mixture names its validation "
     "episodes per source"),
    ('[data]\n[[data.sources]]\nshards = "/a"\nweight = 1\nval_episodes = [2]\n', ["data.val_fraction=0.1"],
     "data.val_fraction: set data.val_fraction (of every source) or the sources' val_episodes, not both"),
    ("", ['data.shards={"/a" = 1}', "data.norm_from=checkpoint"], "data.norm_from: 'checkpoint' gives every source"),
    ("", ["data.shards=/d", "data.fps=-10"], "data.fps: must be a frame rate >= 0"),
])
def test_a_bad_mixture_is_one_line_naming_the_key(tmp_path, toml, overrides, message):
    f = tmp_path / "mix.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(f, [*MIX, *overrides])
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_the_cli_refuses_a_bad_mixture_with_exit_2(tmp_path, capsys):
    from trainkit.cli import main

    f = tmp_path / "mix.toml"
    f.write_text(SOURCES.replace("weight = 0.3", "weight = 0"))
    sets = [a for o in MIX for a in ("--set", o)]
    assert main(["run", str(f), *sets]) == 2
    err = capsys.readouterr().err
    assert err == "trainkit: data.sources[1]: weight must be a number > 0 (weights are normalised to sum 1), got 0.0\n"


def test_gil_switch_ms_is_milliseconds_or_refused():
    assert load_config(None, BASE).data.gil_switch_ms == 0.0  # default: the interpreter's own interval
    assert load_config(None, [*BASE, "data.gil_switch_ms=0.5"]).data.gil_switch_ms == 0.5
    for bad in ("-1", "nan", "1000"):
        with pytest.raises(ConfigError, match=r"^data\.gil_switch_ms: must be milliseconds in \[0, 100\]"):
            load_config(None, [*BASE, f"data.gil_switch_ms={bad}"])

"""Presets by name and the listings (issue 26, item 8): `trainkit configs`, a config argument that
names a shipped preset, `trainkit ladder --list-rungs`, and the wheel carrying the TOML files.

Oracles: the folder's files read here (glob, their first lines), the same config loaded by path,
the files inside a wheel built by pip from a copy of the repository, and that wheel unpacked in a
folder with no repository around it (the listing and a name must work from there)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.cli import main
from trainkit.config import load_config
from trainkit.configs import presets_dir, resolve_config
from trainkit.errors import ConfigError
from trainkit.trials.ladder import RUNGS, default_target

ROOT = Path(__file__).resolve().parents[3]
FOLDER = ROOT / "trainkit" / "configs"
SHIPPED = sorted(FOLDER.glob("*.toml"))
BASE = ["data.shards=/d", "output.dir=/o"]


def _first_line(path: Path) -> str:
    return path.read_text(encoding="utf-8").splitlines()[0]


def test_trainkit_configs_lists_every_toml_with_its_first_line(capsys):
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SHIPPED) >= 9
    for line, path in zip(lines, SHIPPED):
        name, _, rest = line.partition(" ")
        assert name == path.stem and rest.strip() == _first_line(path).lstrip("# ").strip(), line


def test_a_new_file_is_listed_with_no_code_change(tmp_path, monkeypatch, capsys):
    import trainkit.configs as presets

    for p in SHIPPED:
        shutil.copy(p, tmp_path)
    (tmp_path / "my_recipe.toml").write_text("# My own recipe: pi05 tiny, longer.\n[train]\nsteps = 5\n")
    (tmp_path / "notes.txt").write_text("not a preset")
    monkeypatch.setattr(presets, "presets_dir", lambda: tmp_path)
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SHIPPED) + 1
    assert [x.split()[0] for x in lines if "My own recipe" in x] == ["my_recipe"]
    assert resolve_config("my_recipe") == tmp_path / "my_recipe.toml"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_preset_starts_with_a_one_line_description(path):
    """The first line is a `#` comment that stands alone: a sentence that is not cut mid-way."""
    first = _first_line(path)
    assert first.startswith("# ") and not first.startswith("#  "), first
    text = first[2:]
    assert 20 <= len(text) <= 110 and text.count("(") == text.count(")"), text
    assert not text.endswith((":", ",", "(", " the", " and", " from")), text


def test_a_preset_name_loads_the_shipped_file():
    for path in SHIPPED:
        if path.stem.startswith(("pi05", "gr00t", "dreamzero")):
            assert load_config(path.stem, BASE, required=False) == load_config(path, BASE, required=False), path.stem
    assert resolve_config("pi05_tiny") == presets_dir() / "pi05_tiny.toml"
    assert (presets_dir() / "pi05_tiny.toml").read_bytes() == (FOLDER / "pi05_tiny.toml").read_bytes()


def test_inspect_by_name_says_what_inspect_by_path_says(capsys):
    assert main(["inspect", "pi05_optimised", "--json", "--world-size", "2", "--gpu-memory-gib", "140"]) == 0
    by_name = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(FOLDER / "pi05_optimised.toml"), "--json", "--world-size", "2",
                 "--gpu-memory-gib", "140"]) == 0
    assert by_name == json.loads(capsys.readouterr().out)


def test_trainkit_run_by_name_trains(shards_rgb, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    assert main(["run", "pi05_tiny", "--set", f"data.shards={shards_rgb}", "--set", f"output.dir={out}",
                 "--set", "train.steps=2", "--set", "data.num_workers=0"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps_run"] == 2


def test_a_path_that_exists_wins_over_a_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("pi05_tiny").write_text((FOLDER / "gr00t_tiny.toml").read_text())  # a file named like the preset
    assert load_config("pi05_tiny", BASE, required=False).model.family == "gr00t"
    assert load_config("pi05_optimised", BASE, required=False).model.family == "pi05"  # no such file: the preset


@pytest.mark.parametrize("command", ["run", "inspect", "tune", "ladder"])
def test_an_unknown_name_is_one_line_listing_the_presets(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    extra = {"tune": ["--memory-cap", "1", "--out", "out"], "ladder": ["--out", "out"]}.get(command, [])
    assert main([command, "pi05_tiy", *extra, "--set", "data.shards=x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainkit: pi05_tiy: no such config file and no preset of that name; presets: ")
    assert err.count("\n") == 1 and all(p.stem in err for p in SHIPPED), err
    assert not (tmp_path / "out").exists()


def test_a_preset_name_with_the_suffix_says_how_to_name_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^pi05_tiny\.toml: config file not found \(the preset is named "
                                          r"'pi05_tiny', without \.toml\)$"):
        load_config("pi05_tiny.toml", BASE)
    with pytest.raises(ConfigError, match=r"^sub/pi05_tiny\.toml: config file not found$"):
        load_config("sub/pi05_tiny.toml", BASE)  # a path: never a preset


def test_the_ladder_finds_the_target_of_a_preset_baseline():
    assert default_target(resolve_config("pi05_baseline")) == presets_dir() / "pi05_optimised.toml"


def test_ladder_list_rungs_prints_one_line_per_rung(capsys):
    assert main(["ladder", "--list-rungs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(RUNGS)
    for line, rung in zip(lines, RUNGS):
        assert line.split()[0] == rung.name and rung.title in line, line
        assert all(key in line for key in rung.sets), line
        assert ("needs CUDA" in line) == rung.needs_cuda, line
    assert main(["ladder"]) == 2  # neither a config nor --list-rungs
    assert capsys.readouterr().err == "trainkit: ladder: the baseline config is required (or --list-rungs)\n"


def test_ladder_help_names_no_source_file(capsys):
    with pytest.raises(SystemExit):
        main(["ladder", "--help"])
    text = capsys.readouterr().out
    assert "--list-rungs" in text and "ladder.py" not in text and "trainkit/" not in text


def _wheel(tmp_path: Path) -> Path:
    """A wheel built by pip, without network, from a copy of the repository's packaging inputs."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    for pkg in ("datakit", "trainkit"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "whl"), str(src)], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 and "No module named pip" in done.stderr:
        pytest.skip("pip is not installed in this environment")
    assert done.returncode == 0, done.stderr[-2000:]
    return next((tmp_path / "whl").glob("*.whl"))


@pytest.mark.timeout(600)
def test_the_wheel_ships_the_presets_and_names_work_from_it(tmp_path):
    wheel = _wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"trainkit/configs/{p.name}" for p in SHIPPED} <= names
    assert "trainkit/configs/__init__.py" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    listing = subprocess.run([sys.executable, "-m", "trainkit.cli", "configs"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300, check=False)
    assert listing.returncode == 0, listing.stderr
    assert [x.split()[0] for x in listing.stdout.splitlines()] == [p.stem for p in SHIPPED]
    where = subprocess.run([sys.executable, "-c", "import trainkit.configs as c; print(c.resolve_config('pi05_tiny'))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert where.stdout.strip() == str(site / "trainkit" / "configs" / "pi05_tiny.toml"), where.stderr

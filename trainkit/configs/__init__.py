"""The shipped presets: the TOML files of this folder, installed with the package (package data in
pyproject.toml), so a preset works by name from a `pip install` as from the repository.

    trainkit configs                                  # one line per preset: its name and what it is
    trainkit run pi05_tiny --set data.shards=OUT      # a preset by name (run, inspect, tune, ladder)
    trainkit run my_copy.toml --set data.shards=OUT   # a path: a file that exists always wins

A config argument is a path when that file or folder exists, or when it names a folder or ends in
.toml; otherwise it is a preset name, looked up here (`resolve_config`). An unknown name is one line
listing the presets. Every file here starts with a one-line `#` comment saying what it is: that
line is the preset's description in `trainkit configs`, so a new file is listed with no code
change. `--overlay` stays a path: an overlay is a run's own file (what `trainkit tune` writes).
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from trainkit.errors import ConfigError

SUFFIX = ".toml"


def presets_dir() -> Path:
    """This folder, wherever the package is installed (a plain folder: torch cannot import from a zip)."""
    return Path(str(files(__name__)))


def preset_names() -> list[str]:
    """Every shipped preset, sorted: the .toml files of this folder, without the suffix."""
    return sorted(p.stem for p in presets_dir().glob(f"*{SUFFIX}") if p.is_file())


def description(name: str) -> str:
    """A preset's first line, when it is a `#` comment: what `trainkit configs` shows."""
    with open(presets_dir() / f"{name}{SUFFIX}", encoding="utf-8") as f:
        first = f.readline().strip()
    return first.lstrip("#").strip() if first.startswith("#") else "(no description: the file does not start with a # line)"


def _is_name(text: str) -> bool:
    """Whether a config argument can only be a preset name: no folder part and no .toml suffix."""
    return "/" not in text and "\\" not in text and not text.endswith(SUFFIX)


def resolve_config(config: str | Path) -> Path:
    """The file a config argument means: the path itself when it exists or looks like a path (a
    missing file is then named by the TOML reader), else the preset of that name; ConfigError with
    the list of presets for a name that is neither."""
    path = Path(config)
    text = str(config)
    if path.exists() or not _is_name(text):
        if not path.exists() and "/" not in text and path.stem in preset_names():
            raise ConfigError(text, f"config file not found (the preset is named {path.stem!r}, without {SUFFIX})")
        return path
    if text in preset_names():
        return presets_dir() / f"{text}{SUFFIX}"
    raise ConfigError(text, f"no such config file and no preset of that name; presets: {', '.join(preset_names())}")


def listing() -> str:
    """`trainkit configs`: one line per preset, its name padded, then its description."""
    names = preset_names()
    width = max(map(len, names), default=0)
    return "\n".join(f"{n.ljust(width)}  {description(n)}" for n in names)

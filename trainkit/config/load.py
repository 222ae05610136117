"""Loading the one training config: a TOML file (or a shipped preset), an overlay, dotted `--set` overrides.

    cfg = load_config("trainkit/configs/pi05_tiny.toml", ["train.steps=20", "parallel.group.vision_blocks=4"])
    cfg = load_config("trainkit/configs/pi05_optimised.toml", overlay="best.toml")  # `trainkit tune`'s overlay
    cfg = load_config("pi05_tiny", ["data.shards=OUT"])  # a shipped preset by name (trainkit/configs/)

The sections are in sections.py. Loading is strict: an unknown section or
key, or a value of the wrong type, raises `ConfigError` naming the dotted key, so a typo never
silently trains with a default. `--set` values are parsed as TOML values (`true`, `4`, `1e-4`,
`["a", "b"]`, `{vision_blocks = 4}`); a string field takes the text as it is. Required keys
(they have no sensible default): data.shards, train.steps, train.seed, output.dir, model.preset.

An override or overlay of one mixture form (`data.shards` table or `[[data.sources]]`, data.py)
replaces the other (`_replace_form`).
"""
from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

from trainkit.config.data import DATA_FORMS, DataConfig
from trainkit.config.sections import REQUIRED, ModelConfig, RunConfig, build, field_types, is_union, unknown_key
from trainkit.configs import resolve_config
from trainkit.errors import ConfigError


def load_config(path: str | Path | None, overrides: list[str] = (), *, required: bool = True,
                overlay: str | Path | None = None) -> RunConfig:
    """The config of TOML file `path` (or shipped preset name, trainkit/configs/; None: defaults
    only), then the TOML file `overlay` on top (`trainkit run CONFIG --overlay best.toml`, what
    `trainkit tune` writes), then `key=value` overrides; `required=False` (inspect) accepts a config
    without data.shards / output.dir."""
    raw: dict[str, Any] = _read_toml(resolve_config(path)) if path is not None else {}
    if overlay is not None:
        _apply_overlay(raw, _read_toml(overlay), str(overlay))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(item, "an override is key=value with a dotted key, e.g. train.steps=100")
        _set(raw, key.strip(), text.strip())
    missing = [k for k in REQUIRED if not _has(raw, k) and not (k == "data.shards" and _has(raw, "data.sources"))] \
        if required else []
    if missing:
        what = " (a shard folder, a table {path = weight} or [[data.sources]])" if missing[0] == "data.shards" else ""
        raise ConfigError(missing[0], f"required and not set{what} (required: {', '.join(REQUIRED)})")
    return build(RunConfig, raw, "")


def _read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML file at `path`; ConfigError naming it for anything that is not one (missing, a
    folder, unreadable, not UTF-8, not TOML). Decoded as UTF-8 whatever the locale, as TOML is."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), "config file not found") from None
    except IsADirectoryError:
        raise ConfigError(str(path), "is a folder, not a TOML config file") from None
    except OSError as e:
        raise ConfigError(str(path), f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), f"not UTF-8 text (byte {e.start}): a TOML file is UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), f"not valid TOML ({e})") from None


def _apply_overlay(raw: dict[str, Any], overlay: dict[str, Any], name: str) -> None:
    """Put the overlay's keys into the raw tree, each replacing the config's value (a table such as
    parallel.ac_stride as a whole). Its keys must be the config's: an unknown one is refused here,
    naming the overlay file (model.* keys are the family config's, checked when the model is built)."""
    sections = field_types(RunConfig)
    for section, table in overlay.items():
        if section not in sections:
            raise ConfigError(f"{name}: {section}", unknown_key(RunConfig, section))
        if not isinstance(table, dict):
            raise ConfigError(f"{name}: {section}", f"must be a table, got {table!r}")
        known = field_types(sections[section])
        if sections[section] is DataConfig and all(form in table for form in DATA_FORMS):  # one would drop the other
            raise ConfigError(f"{name}: data.sources", "set data.shards or [[data.sources]], not both")
        for key, value in table.items():
            if sections[section] is not ModelConfig and key not in known:
                raise ConfigError(f"{name}: {section}.{key}", unknown_key(sections[section], key))
            _replace_form(raw.setdefault(section, {}), sections[section], key)[key] = value


def _set(raw: dict[str, Any], key: str, text: str) -> None:
    """Put override `key=text` into the raw tree, parsing text by the target field's type."""
    parts = key.split(".")
    cls: Any = RunConfig
    node = raw
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if cls is ModelConfig and part not in fields and i == len(parts) - 1:  # model.lm_depth=4
            node[part] = _parse(Any, text)
            return
        if part not in fields:
            raise ConfigError(".".join(parts[: i + 1]), unknown_key(cls, part))
        tp = field_types(cls)[part]
        last = i == len(parts) - 1
        if dataclasses.is_dataclass(tp):
            if last:
                raise ConfigError(key, "is a section; set one of its keys")
            node, cls = node.setdefault(part, {}), tp
            continue
        if typing.get_origin(tp) is dict and i == len(parts) - 2:  # parallel.group.vision_blocks=4
            node.setdefault(part, {})[parts[-1]] = _parse(typing.get_args(tp)[1], text)
            return
        if not last:
            raise ConfigError(key, f"{'.'.join(parts[: i + 1])} is not a section")
        _replace_form(node, cls, part)[part] = _parse(tp, text)
        return


def _replace_form(node: dict[str, Any], cls: Any, key: str) -> dict[str, Any]:
    """`node` (a raw section) ready for an override or overlay of `key`: data.shards replaces the
    file's [[data.sources]] and the other way round (both in one file is refused: DataConfig)."""
    if cls is DataConfig and key in DATA_FORMS:
        for other in DATA_FORMS:
            if other != key:
                node.pop(other, None)
    return node


def _parse(tp: Any, text: str) -> Any:
    if is_union(tp):  # data.shards: a table {path = weight} or list as TOML, anything else a path
        if int in typing.get_args(tp) and text.strip().lstrip("+-").isdigit():  # train.micro_batch=16 (or auto)
            return int(text)
        tp = Any if text[:1] in "{[" else str
    if tp is str or typing.get_origin(tp) is Literal:
        return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" else text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # type-checked (and refused) in sections.build, with the key named


def _has(raw: dict[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True

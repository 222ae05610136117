"""An `--overlay` file giving both mixture forms (`data.shards` and `[[data.sources]]`) is refused
naming the file, as the same two forms in one config file are; one form alone replaces the
config's other form (the positive control)."""
from __future__ import annotations

import pytest

from trainkit.config import load_config
from trainkit.errors import ConfigError

BASE = ["train.steps=3", "train.seed=1", "output.dir=/o", "model.preset=tiny"]
SOURCES = '[[data.sources]]\nshards = "/b"\nweight = 1.0\n'


def test_an_overlay_with_both_forms_is_refused_naming_it(tmp_path):
    overlay = tmp_path / "best.toml"
    overlay.write_text('[data]\nshards = "/a"\n' + SOURCES)
    with pytest.raises(ConfigError, match=rf"^{overlay}: data.sources: set data.shards or \[\[data.sources\]\], "
                                          "not both$"):
        load_config(None, ["data.shards=/d", *BASE], overlay=overlay)
    config = tmp_path / "cfg.toml"
    config.write_text('[data]\nshards = "/a"\n' + SOURCES)
    with pytest.raises(ConfigError, match="not both"):  # the same in one config file
        load_config(config, BASE)


def test_an_overlay_with_one_form_replaces_the_other(tmp_path):
    overlay, config = tmp_path / "best.toml", tmp_path / "cfg.toml"
    overlay.write_text(SOURCES)
    config.write_text('[data]\nshards = "/d"\n')
    cfg = load_config(config, BASE, overlay=overlay)
    assert [s.shards for s in cfg.data.sources] == ["/b"] and not cfg.data.shards

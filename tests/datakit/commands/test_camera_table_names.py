"""The camera table never cuts long camera names (issue 35, item 7): DROID's
"observation.images.exterior_image_1_left" was printed "observation.images.exterior_i…" in an
80-column log (`datakit info`, the end of `datakit convert`). The oracle: every name, read back from
the rendered text (title prefix + the row's cell, a wrapped cell joined), is the index's.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from datakit.commands.summary import camera_table

DROID = ("observation.images.wrist_image_left", "observation.images.exterior_image_1_left",
         "observation.images.exterior_image_2_left")


def _index(names):
    cam = SimpleNamespace(height=180, width=320, status="real", episodes={"real": 92233, "blank": 0, "missing": 0})
    return SimpleNamespace(cameras={n: cam for n in names})


def _render(names, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)
    console.print(camera_table(_index(names)))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 60])
def test_droid_names_are_whole_at_80_and_60_columns(width):
    text = _render(DROID, width)
    assert "…" not in text, text
    assert "cameras (observation.images.*)" in text, text
    cells = _cells(text)  # the camera column, wrapped lines joined
    for name in DROID:
        assert name.removeprefix("observation.images.") in cells, (name, text)


def _cells(text: str) -> str:
    return "".join(r.split("│")[1].strip() for r in text.splitlines() if "│" in r)


def test_one_camera_keeps_its_whole_name_wrapped_not_cut():
    text = _render(("observation.images.exterior_image_1_left",), 80)
    assert "…" not in text and "observation.images.exterior_image_1_left" in _cells(text), text

"""`trainkit configs` and `trainkit inspect` agree on parameter counts (issue 35, item 7): a preset's
description (its first line, what `trainkit configs` prints) that states "N.NNB params" (and "the
head's N.NNB trained") states what `trainkit inspect` counts for that preset, to the figure's two
decimals. Before the fix pi05_baseline / pi05_optimised said 3.35B (the probe's count, with a last
layer trainkit does not build) where inspect counts 3.24B.
"""
from __future__ import annotations

import re

import pytest

from trainkit.configs import description, preset_names

STATED = [n for n in preset_names() if re.search(r"\d+\.\d+B params", description(n))]


def test_the_presets_with_full_shapes_state_a_count():
    assert {"pi05_baseline", "pi05_optimised", "gr00t_baseline", "dreamzero_5b_baseline"} <= set(STATED), STATED


@pytest.mark.parametrize("name", STATED)
def test_a_stated_parameter_count_is_inspects(name):
    from trainkit.config import load_config
    from trainkit.estimate.inspect import inspect_model

    text = description(name)
    report = inspect_model(load_config(name, ["data.shards=x"], required=False), world_size=1, gpu=("GPU", 141.0))
    total = float(re.search(r"(\d+\.\d+)B params", text).group(1))
    assert total == round(report["params"]["total"] / 1e9, 2), (text, report["params"]["total"])
    trained = re.search(r"the head's (\d+\.\d+)B trained", text)
    if trained:
        assert float(trained.group(1)) == round(report["params"]["trainable"] / 1e9, 2), (text, report["params"])

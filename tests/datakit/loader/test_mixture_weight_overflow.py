"""Mixture weights whose sum overflows float64 (1e308 and 1e308): only their ratios matter, so
they mix as 1 and 1 (before: NaN shares, a traceback in `trainkit run`, and `datakit plan` /
`trainkit inspect` blaming --samples-per-s)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from datakit.cli import main
from datakit.loader.mixture import MixtureSource, normalised_weights


def test_weights_whose_sum_overflows_give_their_ratios():
    big = normalised_weights([MixtureSource(root="a", weight=1e308), MixtureSource(root="b", weight=1e308)])
    assert big.tolist() == [0.5, 0.5]
    assert np.allclose(normalised_weights([MixtureSource(root="a", weight=1.7e308), MixtureSource(root="b",
                                                                                                  weight=0.85e308)]),
                       [2 / 3, 1 / 3])


def test_plan_of_huge_weights_is_the_plan_of_their_ratios(converted: Path, tmp_path: Path, capsys):
    a, b = (Path(shutil.copytree(converted, tmp_path / n)) for n in ("a", "b"))
    plans = []
    for weights in ("1e308,1e308", "1,1"):
        assert main(["plan", str(a), str(b), "--weights", weights, "--samples-per-s", "100", "--batch-size", "2",
                     "--json"]) == 0, capsys.readouterr().err
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0] == plans[1]

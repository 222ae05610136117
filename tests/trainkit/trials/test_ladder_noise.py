"""`trainkit ladder` marks a ratio as noise when the rungs' step-time spreads overlap (issue 35,
item 7): a rung reported "x1.020" over the previous one where its measured intervals ranged over
the previous rung's own, i.e. where the machine's noise alone gives such a ratio.

The oracle: the ranges written out by hand (min / max of the intervals' samples/s); the table text.
"""
from __future__ import annotations

import pytest

from trainkit.trials.ladder import Measured, RungResult, compare, measure
from trainkit.trials.ladder_report import rows


def _m(speed: float, spread: tuple[float, float]) -> Measured:
    return Measured(step_time_s=4 / speed, samples_per_s_gpu=speed, mfu=None, peak_mem_gib=None, data_wait_ms=0.0,
                    exposed_comm_ms=None, idle_ms=None, micro_batch=4, spread=spread)


@pytest.mark.parametrize("a, b, noise", [((9.0, 11.0), (10.5, 12.0), True), ((9.0, 10.0), (10.5, 12.0), False),
                                         ((10.0, 10.0), (10.0, 10.0), True)])
def test_a_ratio_is_noise_exactly_when_the_spreads_overlap(a, b, noise):
    ratio, is_noise = compare(_m(sum(b) / 2, b), _m(sum(a) / 2, a))
    assert ratio == pytest.approx((sum(b) / 2) / (sum(a) / 2)) and is_noise is noise


def test_the_table_says_noise_beside_the_ratio():
    base = RungResult(name="baseline", title="baseline", status="ok", sets={}, measured=_m(10.0, (9.0, 11.0)))
    same = RungResult(name="compile", title="compile", status="ok", sets={}, measured=_m(10.2, (9.5, 10.8)))
    real = RungResult(name="graphs", title="graphs", status="ok", sets={}, measured=_m(20.0, (19.0, 21.0)))
    same.gain_prev, same.noise_prev = compare(same.measured, base.measured)
    same.gain_base, same.noise_base = same.gain_prev, same.noise_prev
    real.gain_prev, real.noise_prev = compare(real.measured, same.measured)
    real.gain_base, real.noise_base = compare(real.measured, base.measured)
    table = rows([base, same, real])
    assert table[1][10] == "x1.020 (noise)" and table[1][11] == "x1.020 (noise)"
    assert table[2][10] == "x1.961" and table[2][11] == "x2.000"


def test_the_spread_is_the_measured_intervals_range():
    from types import SimpleNamespace

    intervals = [{"step": s, "steps": 1, "step_time_s": 0.1, "samples_per_s_gpu": v, "mfu": None, "peak_mem_gib": None,
                  "data_wait_s": 0.0} for s, v in enumerate([3.0, 9.0, 11.0, 10.0])]
    result = SimpleNamespace(intervals=intervals, profile={})
    m = measure(result, SimpleNamespace(warmup=1), micro_batch=4)
    assert m.spread == (9.0, 11.0)  # the warm-up interval (3.0) is not measured

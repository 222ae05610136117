"""The per-source loss of a mixture: sums and counts per source over an interval's applied steps
(trainkit/observe/source_loss.py) and its rows in the run summary. Oracle: the means computed by
hand from the same per-item losses."""
from __future__ import annotations

import math

import torch

from trainkit.observe.source_loss import SourceLoss
from trainkit.observe.summary import format_summary, source_loss


def test_each_source_gets_the_mean_of_its_items_over_the_applied_steps():
    per = SourceLoss(("droid", "libero", "aloha"), torch.device("cpu"))
    per.add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 0]))  # step 1, micro-batch 1
    per.add(torch.tensor([4.0, 5.0]), torch.tensor([1, 1]))  # step 1, micro-batch 2
    per.end_step(True)
    per.add(torch.tensor([math.nan, 100.0]), torch.tensor([0, 1]))  # a skipped (non-finite) step
    per.end_step(False)
    per.add(torch.tensor([6.0]), torch.tensor([0]))
    per.end_step(True)
    assert per.reduce() == {"loss/droid": (1 + 3 + 6) / 3, "loss/libero": (2 + 4 + 5) / 3,  # aloha: no sample
                            "samples/droid": 3, "samples/libero": 3, "samples/aloha": 0}
    per.add(torch.tensor([7.0, 9.0]), torch.tensor([2, 2]))
    per.end_step(True)
    assert per.reduce() == {"loss/aloha": 8.0, "samples/droid": 0, "samples/libero": 0, "samples/aloha": 2}


def test_the_summary_shows_each_sources_first_and_last_interval():
    history = [{"kind": "interval", "step": 1, "steps": 2, "loss/droid": 0.9, "loss/libero": 1.2},
               {"kind": "interval", "step": 3, "steps": 2, "loss/droid": 0.5},
               {"kind": "interval", "step": 5, "steps": 2, "loss/droid": 0.3, "loss/libero": 0.7}]
    per_source = source_loss(history)
    assert per_source == {"droid": {"first": 0.9, "last": 0.3}, "libero": {"first": 1.2, "last": 0.7}}
    s = {"world_size": 1, "global_batch": 4, "start_step": 0, "steps_run": 6, "first_loss": 1.0, "last_loss": 0.4,
         "source_loss": per_source}
    lines = format_summary(s).splitlines()
    assert [line.split()[-3:] for line in lines if line.strip().startswith(("droid", "libero"))] == \
        [["0.9000", "->", "0.3000"], ["1.2000", "->", "0.7000"]]

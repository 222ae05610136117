"""LoRA off (`model.lora_rank = 0`, every family's default) trains as before LoRA was shared by the
families: DreamZero's and GR00T's tiny losses equal those recorded at 9a836f8 by
tests/fixtures/lora_off_record.py (tests/assets/lora_off_losses.json), bit for bit under the record's torch
on a CPU with a record of its own (its `cpu_kernels` key: tests/fixtures/cpu_kernels.py), within
`OTHER_CPU_ABS` elsewhere (other BLAS kernels sum in other orders). Pi0.5's
record is held by tests/trainkit/models/test_trainkit_family.py. The positive control: LoRA on changes the losses.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cpu_kernels import OTHER_CPU_ABS, cpu_kernels
from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from lora_off_record import RUNS, losses
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture

RECORDED = json.loads((Path(__file__).resolve().parents[2] / "assets" / "lora_off_losses.json").read_text())
THIS_CPU = (RECORDED.get("runs_by_cpu_kernels", {}).get(cpu_kernels(), {}).get("runs")
            if RECORDED["torch"] == torch.__version__ else None)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", sorted(RUNS))
def test_lora_off_gives_the_recorded_losses(family, request, tmp_path):
    config, kind = RUNS[family]
    shards = request.getfixturevalue({"3cam": "shards_3cam", "rgb": "shards_rgb"}[kind])
    want = RECORDED["runs"][family]["losses"]
    off = losses(config, shards, tmp_path / "off", "model.lora_rank=0")
    if THIS_CPU is not None:
        assert off == THIS_CPU[family]["losses"]
    else:
        assert off.keys() == want.keys() and max(abs(off[k] - want[k]) for k in want) <= OTHER_CPU_ABS
    on = losses(config, shards, tmp_path / "on", "model.lora_rank=2")
    assert abs(on["1"] - want["1"]) > OTHER_CPU_ABS  # the control: beyond what either comparison allows

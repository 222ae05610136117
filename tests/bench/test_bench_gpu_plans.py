"""The GPU bench plans (bench/gpu/plans/*.toml) name only what trainkit accepts: every variant's config
with its overrides, as the GPU run and as the --cpu dry run apply them, loads through
trainkit.config and builds its model config (preset and model.* keys), and every run's config loads
with its overrides. Cheap: no model, no data, no training. The slow test runs one family's dry run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainkit.config import load_config
from trainkit.models import build_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
from gpu_plan import (PlanError, all_plans, load_plan, run_parts, variant_config,  # noqa: E402
                      variant_sets)

PLANS = all_plans()


def test_every_family_has_a_plan():
    assert {p.stem for p in PLANS} >= {"pi05", "gr00t", "dreamzero"}


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_plan_variants_are_valid_trainkit_configs(path, tmp_path):
    plan = load_plan(path)
    assert plan.variants and plan.probe is not None
    for v in plan.variants:
        for cpu in (False, True):
            sets = variant_sets(plan, v, cpu=cpu, shards=tmp_path, init_from=tmp_path if v.init_from else "")
            cfg = load_config(variant_config(plan, v), [*sets, f"output.dir={tmp_path}"])
            assert cfg.model.family == plan.family, f"{v.name}: config of family {cfg.model.family}"
            build_config(cfg.model.family, cfg.model.preset, cfg.model.overrides)
            if cpu:
                assert cfg.model.preset == "tiny" and not cfg.parallel.compile and not cfg.parallel.cuda_graphs, v.name
    for r in plan.runs:
        for cpu in (False, True):
            config, overrides, _ = run_parts(plan, r, cpu=cpu)
            cfg = load_config(config, [*overrides, f"data.shards={tmp_path}"], required=False)
            build_config(cfg.model.family, cfg.model.preset, cfg.model.overrides)


def test_plan_refuses_unknown_keys_and_dangling_names(tmp_path):
    good = (ROOT / "bench" / "gpu" / "plans" / "gr00t.toml").read_text()
    cases = {"unknown key": good.replace("steps = 14", "steps = 14\nstpes = 3"),
             "not another variant": good.replace('compare = "optimised_mbs16_graphs"', 'compare = "nope"'),
             "is set by the harness": good.replace('overrides = ["train.micro_batch=16", "train.global_batch=0"]\nprofile',
                                                   'overrides = ["train.steps=3"]\nprofile', 1),
             "not a setting of": good.replace('args = ["compile_mbs16", "compile_mbs64"]', 'args = ["mbs_9000"]'),
             "trains the head alone": good.replace("cached_backbone = true\n", 'cached_backbone = true\nprobe = "compile_mbs64"\n')}
    for why, text in cases.items():
        assert text != good, why
        (tmp_path / "p.toml").write_text(text)
        with pytest.raises(PlanError, match=why):
            load_plan(tmp_path / "p.toml")


@pytest.mark.slow
def test_cpu_dry_run_of_gr00t_main(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "gpu.py"), "gr00t", "--cpu", "--only", "optimised_mbs16_graphs",
                           "optimised_mbs16_eager", "probe",
                           "--out", str(out), "--work", str(tmp_path / "work")], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "gr00t.json").read_text())
    assert res["schema"] == "bench.gpu/1" and res["mode"] == "cpu" and res["probe"]["status"] == "skipped"
    assert [v["status"] for v in res["variants"]] == ["ok"] * 2  # two of main's variants: the suite's time
    graphs, eager = (next(v for v in res["variants"] if v["name"] == n)
                     for n in ("optimised_mbs16_graphs", "optimised_mbs16_eager"))
    assert eager["vs"]["variant"] == graphs["name"] and eager["vs"]["loss"]["steps"] == 3
    assert all(v["samples_per_s"] > 0 and len(v["losses"]) == 3 for v in res["variants"])


@pytest.mark.slow
def test_cpu_dry_run_of_the_cached_backbone_builds_the_cache_first_and_reports_it_apart(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "gpu.py"), "gr00t", "--cpu", "--only",
                           "cached_backbone_mbs256", "--out", str(out), "--work", str(tmp_path / "work")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (v,) = json.loads((out / "gr00t.json").read_text())["variants"]
    assert v["status"] == "ok" and v["cache"]["status"] == "ok" and "encode-backbone" in v["cache"]["command"]
    assert f"data.shards={v['cache']['folder']}" in v["command"] and v["samples_per_s"] > 0
    assert v["vs_baseline"] is None and v["vs_probe"] is None and v["probe_row"] is None  # never in a ratio


def test_card_held_names_the_processes_on_the_card(tmp_path, monkeypatch):
    """gpu.py records what holds the card before a variant starts (a stale trial's 54 GiB made the
    next variants OOM on the 2026-12-07 lease); none without nvidia-smi or with an empty card."""
    import gpu

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '29614, 55268'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}")
    assert gpu.card_held() == [{"pid": 29614, "mib": 55268}]
    fake.write_text("#!/bin/sh\n")
    assert gpu.card_held() == []
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu.card_held() == []

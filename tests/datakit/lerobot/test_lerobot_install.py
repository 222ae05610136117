"""datakit installs and imports beside LeRobot 0.6.1 without touching its torch (its own venv).

- every requirement of pyproject's [project].dependencies that the LeRobot venv already has is
  satisfied by the version it has, so `pip install robodata` there replaces nothing (torch is
  pinned only in tools/constraints.txt, for CI); positive control: CI's own torch pin is not;
- `import datakit.lerobot` (and the loader) in that venv uses the venv's torch and loads no
  trainkit module nor a trainkit-only dependency.
Skipped without /tmp/lerobot-venv/.ready.
"""
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                reason="no lerobot venv at /tmp/lerobot-venv")
TRAINKIT_ONLY = ("trainkit", "safetensors", "sentencepiece", "tokenizers")

UNSATISFIED = """
import json, sys
from importlib.metadata import version, PackageNotFoundError
from packaging.requirements import Requirement
bad = []
for line in json.loads(sys.argv[1]):
    req = Requirement(line)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        continue  # pip would add it, not replace anything
    if not req.specifier.contains(have, prereleases=True):
        bad.append(f"{line} (have {have})")
print(json.dumps(bad))
"""


def _unsatisfied(requirements: list[str]) -> list[str]:
    r = subprocess.run([str(LEROBOT_PY), "-c", UNSATISFIED, json.dumps(requirements)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_install_replaces_nothing_in_a_lerobot_env():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert _unsatisfied(deps) == []
    pins = [ln.strip() for ln in (ROOT / "tools" / "constraints.txt").read_text().splitlines()
            if ln.strip().startswith("torch==")]
    assert pins and _unsatisfied(pins) != []  # positive control: CI's pin would replace LeRobot's torch


def test_import_uses_lerobots_torch_and_no_trainkit_dependency():
    code = ("import sys, json, torch, datakit.lerobot, datakit.loader; "
            "print(json.dumps([torch.__file__, sorted({m.split('.')[0] for m in sys.modules})]))")
    r = subprocess.run([str(LEROBOT_PY), "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    torch_file, modules = json.loads(r.stdout.strip().splitlines()[-1])
    assert torch_file.startswith(str(LEROBOT_PY.parents[1]))
    assert "datakit" in modules and not set(TRAINKIT_ONLY) & set(modules), set(TRAINKIT_ONLY) & set(modules)

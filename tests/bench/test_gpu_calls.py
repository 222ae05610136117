"""The device-call scripts (bench/gpu/calls/*.sh) waste no device minutes on a typo: every gpu.py
`--only` name is in its plan, every outer `timeout` leaves gpu.py its budget + 60 s (its SIGTERM grace
and report), the timeouts together fit one 600 s call, and at most 8 files land under $OUT (the
device returns no more). A control script with each mistake must be refused."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CALLS = ROOT / "bench" / "gpu" / "calls"
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
from gpu_plan import load_plan  # noqa: E402

CALL_S = 600  # the device's limit on one command
SETUP_S = 10  # the pip lines before the first timeout


def known_names(family: str) -> set[str]:
    plan = load_plan(family)
    names = {v.name for v in plan.variants} | {r.name for r in plan.runs}
    groups = {v.group for v in plan.variants} | {r.group for r in plan.runs}
    return names | groups | ({"probe"} if plan.probe else set()) | {"all"}


def problems(text: str) -> list[str]:
    """What is wrong with a call script's text, one line per problem."""
    out, total, files = [], 0, set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for m in re.finditer(r"\$OUT/([\w.-]+)(/)?", line):
            files.add(m.group(1))  # a folder: gpu.py's one JSON in it
        for m in re.finditer(r"timeout (\d+) ", line):
            total += int(m.group(1))
        gpu = re.search(r"timeout (\d+) python3 bench/gpu/gpu\.py (\w+) .*?--budget-s (\d+) --only ([\w ]+?)\s*>", line)
        if "bench/gpu/gpu.py" in line and not gpu:
            out.append(f"a gpu.py line without `timeout N ... --budget-s B --only NAMES >`: {line[:80]}")
            continue
        if gpu:
            limit, family, budget, only = int(gpu[1]), gpu[2], int(gpu[3]), gpu[4].split()
            if limit < budget + 60:
                out.append(f"gpu.py {family}: timeout {limit} < budget {budget} + 60")
            unknown = sorted(set(only) - known_names(family))
            if unknown:
                out.append(f"gpu.py {family}: --only {unknown} not in its plan")
    if total + SETUP_S > CALL_S:
        out.append(f"timeouts sum to {total} s + {SETUP_S} s of set-up > {CALL_S} s")
    if len(files) > 8:
        out.append(f"{len(files)} files under $OUT > 8")
    return out


SCRIPTS = sorted(p for p in CALLS.glob("*.sh") if p.name != "go.sh")


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_call_script_fits_the_device(path):
    assert problems(path.read_text()) == []


def test_go_picks_scripts_that_exist():
    text = (CALLS / "go.sh").read_text()
    for name in re.findall(r":-(\w+\.sh)", text):
        assert (CALLS / name).is_file(), name
    assert {"A.sh", "H.sh"} <= set(re.findall(r":-(\w+\.sh)", text))


def test_control_scripts_are_refused():
    good = "timeout 200 python3 bench/gpu/gpu.py gr00t --out $OUT/g --budget-s 140 --only optimised_mbs16_graphs > $OUT/g.log\n"
    assert problems(good) == []
    assert any("not in its plan" in p for p in problems(good.replace("mbs16_graphs", "mbs16_grahps")))
    assert any("+ 60" in p for p in problems(good.replace("timeout 200", "timeout 150")))
    assert any("> 600 s" in p for p in problems(good * 3))
    many = "".join(f"echo > $OUT/f{i}.log\n" for i in range(9))
    assert any("> 8" in p for p in problems(many))

"""The folder listings stay readable (issue 37): trainkit's top holds at most 17 entries (the rooms of
ARCHITECTURE.md's listing), tests/ and bench/ at most 12 each, and tests/ mirrors the packages (a
test file lives in a room folder, not at the top, the cross-package import graph test aside)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"trainkit": 17, "tests": 12, "bench": 12}
TOP_TESTS = {"test_import_graph.py"}  # both packages' import graph: no one room's


def entries(folder: Path) -> list[str]:
    return sorted(e.name for e in folder.iterdir() if e.name != "__pycache__" and not e.name.startswith("."))


def test_top_level_entries_within_limits():
    over = {name: entries(ROOT / name) for name, limit in LIMITS.items() if len(entries(ROOT / name)) > limit}
    assert not over, "\n".join(f"{n}/: {len(e)} entries (limit {LIMITS[n]}): {', '.join(e)}" for n, e in over.items())


def test_test_files_live_in_rooms():
    stray = [n for n in entries(ROOT / "tests") if n.startswith("test_") and n not in TOP_TESTS]
    assert not stray, f"test files at tests/' top (move them to tests/<package>/<room>/): {stray}"

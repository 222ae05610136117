"""Family knowledge stays in the family (issue 37, item 2): no trainkit module outside
trainkit/models/ names a family in its code, so a fourth family edits no trainkit file outside
models/ (its export formats, README texts and LeRobot processor steps are fields of its record,
trainkit/models/family.py).

"Names" means the code: identifiers, attributes, imports and string literals that contain a
registered family's name (pi05, gr00t, dreamzero) or its upstream spelling (GR00T's "groot").
Docstrings and comments may cite a family as an example; they are not read. The names come from the
registry, so a new family is checked without editing this file.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from trainkit.models import FAMILIES

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = ("groot",)  # spellings of a family's name in the code it mirrors (LeRobot's GrootPolicy)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)}


def family_names(source: str, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, word) for every code word of `source` naming one of `names` (case-insensitive)."""
    pattern = re.compile("|".join(re.escape(n) for n in names), re.IGNORECASE)
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            words = [node.value]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            words = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        else:
            continue
        found += [(node.lineno, w) for w in words if pattern.search(w)]
    return found


def test_no_trainkit_module_outside_models_names_a_family():
    names = (*FAMILIES, *UPSTREAM)
    assert {"pi05", "gr00t", "dreamzero"} <= set(FAMILIES)
    found = [f"{p.relative_to(ROOT)}:{line}: {word[:80]!r}"
             for p in sorted((ROOT / "trainkit").rglob("*.py")) if "models" not in p.relative_to(ROOT).parts[:2]
             for line, word in family_names(p.read_text(), names)]
    assert not found, "trainkit code outside models/ naming a family:\n" + "\n".join(found)


def test_a_family_name_in_code_is_found_and_one_in_a_docstring_is_not():
    """Positive control: what issue 37 found (a format list in cli.py, GR00T's step names and README
    choice in weights/), each form once; docstrings and comments left alone."""
    source = '''"""Exports a pi05 run (a docstring)."""
from trainkit.models.gr00t import lerobot_policy  # a comment naming dreamzero
FORMATS = ("lerobot", "dreamzero")
STEPS = ("groot_n1_7_pack_inputs_v1",)
def export(fam):
    """A gr00t export (a docstring)."""
    return _groot_readme if fam.pi05 else None
'''
    found = family_names(source, ("pi05", "gr00t", "dreamzero", "groot"))
    assert sorted(w for _, w in found) == sorted(["trainkit.models.gr00t", "dreamzero", "groot_n1_7_pack_inputs_v1",
                                                 "_groot_readme", "pi05"])

"""Every repository file a module docstring names exists, as the docs' paths do (test_docs_paths.py):
docstrings are where a reader is sent next, and issue 37 found 11 naming files that had moved or
gone (`checkpoint.py`, `checkpoint_manifest.py`, `optim.py`, ...).

Read: the docstrings (module, class, function) of every .py file under datakit/, trainkit/, bench/
and tools/. A word that starts with a top-level folder (`trainkit/weights/load.py`) must exist from
the repository root; a shorter module path (`load.py`, `engines/ray.py`) must exist beside the file,
in a folder above it, or one folder down from either (`checkpoint/run_lock.py` from trainkit/train.py
may say `run_lock.py`). Other file names (`index.json`, `best.toml`) are a run's outputs, not the
repository's, and paths of the code a module mirrors (`lerobot/...`, `groot/...`) are upstream's.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from test_docs_paths import expand_braces

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("datakit", "trainkit", "bench", "tools")
TOP = ("datakit/", "trainkit/", "bench/", "docs/", "tests/", "tools/")
UPSTREAM = ("lerobot/", "groot/")  # LeRobot's and DreamZero's (groot.vla) package paths, cited as the source
COPIES = "bench/gpu/probes/"  # exact copies of ../shared/probes/ (SHA256SUMS): their text is not ours to edit
WORD = re.compile(r"(?<![\w./~$@:<{-])([\w.*<>{},/-]*[\w*>}]\.(?:py|md|toml|json|jsonl|txt|sh|csv|yaml|yml))(?![\w/])")


def docstrings(source: str) -> list[str]:
    return [d for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and (d := ast.get_docstring(node, clean=False))]


def _exists(folder: Path, name: str) -> bool:
    return any(folder.glob(name)) if any(c in name for c in "*?[") else (folder / name).exists()


def missing(text: str, here: Path, root: Path = ROOT) -> list[str]:
    """The repository paths `text` (a docstring of a file in folder `here`) names that do not exist."""
    out = []
    for word in (m.group(1) for m in WORD.finditer(text)):
        if word.startswith(UPSTREAM):
            continue
        for name in (re.sub(r"<[^<>]*>", "*", w) for w in expand_braces(word)):
            if name.startswith(TOP):
                found = _exists(root, name)
            elif name.endswith(".py"):
                above = [here, *[p for p in here.parents if p == root or root in p.parents]]
                found = any(_exists(f, name) for d in above for f in (d, *(s for s in d.iterdir() if s.is_dir())))
            else:
                continue
            if not found:
                out.append(word)
                break
    return out


def test_every_path_a_docstring_names_exists():
    stale = [f"{p.relative_to(ROOT)}: {w}" for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             if not p.relative_to(ROOT).as_posix().startswith(COPIES)
             for d in docstrings(p.read_text()) for w in missing(d, p.parent)]
    assert not stale, "paths named in docstrings that do not exist:\n" + "\n".join(stale)


def test_what_counts_as_a_stale_path(tmp_path):
    """Positive control on a tree of its own: a moved module, a gone top-level path and a gone
    neighbour are found; a sibling, a module one folder down, outputs and upstream paths are not."""
    (tmp_path / "trainkit" / "checkpoint").mkdir(parents=True)
    for name in ("trainkit/train.py", "trainkit/checkpoint/dcp.py", "trainkit/checkpoint/manifest.py"):
        (tmp_path / name).write_text("")
    text = ("Saves with checkpoint.py (moved), dcp.py, checkpoint/manifest.py and manifest.py; see "
            "trainkit/optim.py, trainkit/checkpoint/{dcp,reader}.py; writes index.json and best.toml; "
            "mirrors lerobot/policies/pi05/modeling_pi05.py.")
    assert missing(text, tmp_path / "trainkit", tmp_path) == [
        "checkpoint.py", "trainkit/optim.py", "trainkit/checkpoint/{dcp,reader}.py"]

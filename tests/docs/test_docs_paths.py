"""Every repository path that README.md and docs/*.md name exists, and the README stays a front door.

A path is looked for where the docs name files: in `code spans`, in fenced code blocks, in link
targets, and in the file tree of the README (a fenced block whose first line is a top-level folder
such as `datakit/`, where indentation gives each entry its parent folder: two spaces a level).
A word counts as a repository path only when it starts with a top-level entry of the repository
(`datakit/`, `trainkit/`, `bench/`, `docs/`, `tests/`, `tools/`, `.ci/`, or the files `Makefile`,
`pyproject.toml`, `README.md`), so user paths in examples (`out/`, `runs/...`, `demo-out/`, `droid/`,
`s3://...`, `../shared/...`, `~/.cache/...`) are never checked. Link targets are relative to the
document; one that leaves the repository is skipped. `{a,b}` is expanded (`pi05_{tiny,baseline}.toml`
names two files); a placeholder (`<family>`, `{R}`) or a `*` is a glob that must match something.
"""
from __future__ import annotations

import itertools
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 160  # issue 24: a front door; the rest lives in docs/

TOP_DIRS = ("datakit", "trainkit", "bench", "docs", "tests", "tools", ".ci")
TOP_FILES = ("Makefile", "pyproject.toml", "README.md")
SUFFIXES = (".py", ".md", ".toml", ".json", ".jsonl", ".txt", ".sh", ".csv", ".png", ".yaml", ".yml")

# a path character, or a brace group {a,b} (commas only inside braces, so "a.py, b.py" is two words)
_SEGMENT = r"(?:[\w.*<>/-]|\{[\w.,*-]*\})*"
_TOPS = "|".join(re.escape(d) for d in TOP_DIRS)
PATH_RE = re.compile(rf"(?<![\w./~$@:-])(?:(?:{_TOPS})/{_SEGMENT}|(?:Makefile|pyproject\.toml|README\.md)(?!\w))")
FENCE_RE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
SPAN_RE = re.compile(r"`([^`]+)`")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
TREE_LINE_RE = re.compile(r"^( *)(\S+)")


def expand_braces(text: str) -> list[str]:
    """`a{b,c}d` -> [abd, acd], every group; a group without a comma is a placeholder (a glob)."""
    parts = re.split(r"(\{[^{}]*\})", text)
    choices = [p[1:-1].split(",") if p.startswith("{") and "," in p else ["*" if p.startswith("{") else p]
               for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def clean(candidate: str) -> list[str]:
    """The repository paths a matched word names (none when it is not a path)."""
    word = candidate.rstrip(".,;:")
    if not (word in TOP_FILES or "/" in word or word.endswith(SUFFIXES)):
        return []
    return [re.sub(r"<[^<>]*>", "*", p) for p in expand_braces(word)]


def paths_in_text(text: str) -> list[str]:
    return [p for m in PATH_RE.finditer(text) for p in clean(m.group(0))]


def tree_paths(block: str) -> list[str]:
    """Entries of a file tree: `name/` is a folder, `name.ext` a file; a line indented deeper than
    one level below the last folder, or whose first word is neither, is a description."""
    folders: list[str] = []
    out = []
    for line in block.splitlines():
        m = TREE_LINE_RE.match(line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        depth = indent // 2
        if indent % 2 or depth > len(folders):
            continue
        if not (name.endswith("/") or name.endswith(SUFFIXES) or name in TOP_FILES):
            continue
        parent = "/".join(folders[:depth])
        out += [re.sub(r"<[^<>]*>", "*", f"{parent}/{n}" if parent else n) for n in expand_braces(name)]
        folders = folders[:depth] + ([name.rstrip("/")] if name.endswith("/") else [])
    return out


def is_tree(info: str, body: str) -> bool:
    first = next((line for line in body.splitlines() if line.strip()), "")
    m = re.match(r"^([\w.-]+)/(\s|$)", first)
    return info.strip() in ("", "text") and m is not None and m.group(1) in TOP_DIRS


def named_paths(text: str, here: str) -> list[str]:
    """Every repository path a document names, relative to the repository root; `here` is the
    document's folder (relative to the root, "" for the root), which its link targets start from."""
    found = []
    for m in FENCE_RE.finditer(text):
        info, body = m.group(1), m.group(2)
        found += paths_in_text(body)
        if is_tree(info, body):
            found += tree_paths(body)
    prose = FENCE_RE.sub("", text)
    for span in SPAN_RE.findall(prose):
        found += paths_in_text(span)
    for target in LINK_RE.findall(prose):
        target = target.split("#")[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # an anchor, https:, mailto:
            continue
        path = posixpath.normpath(posixpath.join(here, target))
        if not path.startswith(".."):
            found += [path]
    return list(dict.fromkeys(found))


def exists(path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path.rstrip("/")))
    return (ROOT / path).exists()


def test_named_paths_exist():
    missing = [f"{doc.relative_to(ROOT)}: {p}" for doc in DOCS
               for p in named_paths(doc.read_text(), doc.parent.relative_to(ROOT).as_posix()) if not exists(p)]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_readme_tree_lists_every_module():
    """The other half of "the file tree matches the code": every top-level module and package of
    datakit/ and trainkit/ has its line in the folder tree of docs/layout.md (the README links it; package
    markers and caches aside)."""
    text = (ROOT / "docs" / "layout.md").read_text()
    listed = {p for m in FENCE_RE.finditer(text) if is_tree(m.group(1), m.group(2)) for p in tree_paths(m.group(2))}
    unlisted = [f"{pkg}/{e.name}{'/' if e.is_dir() else ''}" for pkg in ("datakit", "trainkit")
                for e in sorted((ROOT / pkg).iterdir())
                if e.name not in ("__init__.py", "__pycache__") and (e.is_dir() or e.suffix == ".py")]
    unlisted = [p for p in unlisted if p not in listed]
    assert not unlisted, "not in docs/layout.md's file tree:\n" + "\n".join(unlisted)


def test_readme_is_a_front_door():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (limit {README_MAX_LINES})"


def test_what_counts_as_a_path():
    """The extractor on a document of its own: what it checks and what it leaves alone."""
    sample = (
        "Run `datakit convert droid/ out/` then `trainkit run trainkit/configs/pi05_{tiny,optimised}.toml`;\n"
        "see `datakit/loader/sampler.py`, `tests/test_x.py::test_y`, `bench/gpu/plans/<family>.toml`,\n"
        "[scale-out](scale-out.md#cache), [up](../bench/results/loader.md), [web](https://x.org/docs/a.md),\n"
        "`s3://bucket/docs/x`, `../shared/probes/p.py`, `~/.cache/datakit/decoders.json`, `runs/a/best.toml`,\n"
        "`Makefile`, `datakit.loader.config`, `samples-rank{R}.jsonl`.\n"
        "```\ntrainkit/\n  models/         families; pi05/ (a description, not an entry)\n"
        "    pi05/       one family\n                  continuation.py is a description\n"
        "  configs/        pi05_{tiny,baseline}.toml\n  cli.py\n"
        "bench/            results/\n```\n"
    )
    assert sorted(named_paths(sample, "docs")) == sorted([
        "trainkit/", "trainkit/models/", "trainkit/models/pi05/", "trainkit/configs/", "trainkit/cli.py", "bench/",
        "trainkit/configs/pi05_tiny.toml", "trainkit/configs/pi05_optimised.toml", "datakit/loader/sampler.py",
        "tests/test_x.py", "bench/gpu/plans/*.toml", "Makefile", "docs/scale-out.md", "bench/results/loader.md",
    ])

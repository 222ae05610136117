"""The import graph of both packages: no circle between modules, none between the rooms of a
package (its top-level modules and folders), no arrow from datakit up to trainkit, and only
datakit's `cli.py` imports its verbs (`datakit/commands/`): what a verb computes lives in a room.

Every import counts, those inside functions too: a lazy import is still an arrow. The graph is read
from the source with `ast`, so nothing is imported to build it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("datakit", "trainkit")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a import b` names a.b when b is a module)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:  # `import a.b.c` of a module: the deepest one that exists
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between rooms: `trainkit.checkpoint.dcp` lives in room `trainkit.checkpoint`."""
    def room(m: str) -> str:
        return ".".join(m.split(".")[:2])
    rooms: dict[str, set[str]] = {}
    for m, edges in graph.items():
        if m in PACKAGES:  # the package's own __init__ is its front, not a room
            continue
        rooms.setdefault(room(m), set()).update(room(e) for e in edges if e not in PACKAGES and room(e) != room(m))
    return rooms


def test_the_graph_is_read():
    graph = import_graph()
    assert "trainkit.train" in graph["trainkit.cli"] or "trainkit.train" in set().union(*graph.values())
    assert "datakit.loader.config" in graph["trainkit.data"] | graph["datakit.loader"]


def test_no_module_imports_itself_round_a_circle():
    assert _circles(import_graph()) == []


def test_no_circle_between_rooms():
    assert _circles(_rooms(import_graph())) == []


def test_datakit_never_imports_trainkit():
    up = sorted((m, e) for m, edges in import_graph().items() if m.startswith("datakit") for e in edges
                if e.startswith("trainkit"))
    assert up == []


def commands_importers(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, verb module) for every arrow into datakit.commands from outside it, cli.py aside."""
    return sorted((m, e) for m, edges in graph.items() for e in edges
                  if e.startswith("datakit.commands") and not m.startswith("datakit.commands") and m != "datakit.cli")


def test_only_the_cli_imports_commands():
    assert commands_importers(import_graph()) == []


def test_an_arrow_into_commands_is_found():
    """Positive control: the arrow of issue 37 (trainkit inspect reading `datakit plan`'s mixture
    model), and the cli's own arrows, which are allowed."""
    graph = {"trainkit.estimate.loader": {"datakit.commands.plan.mixture"},
             "datakit.cli": {"datakit.commands.plan.command"}, "datakit.commands.plan.command": {"datakit.loader"}}
    assert commands_importers(graph) == [("trainkit.estimate.loader", "datakit.commands.plan.mixture")]


@pytest.mark.parametrize("graph", [
    {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}},
    {"trainkit.p.one": {"trainkit.q.two"}, "trainkit.q.two": {"trainkit.p.three"}, "trainkit.p.three": set()},
])
def test_a_planted_circle_is_found(graph):
    """Positive control: a circle of modules, and a circle of rooms made of modules that form none."""
    assert _circles(graph) or _circles(_rooms(graph))

"""The trainer's modules form no import circle (``TYPE_CHECKING`` imports included: a stage that
names ``Trainer`` for its types still takes the whole trainer), and no module grows past 400
lines (STYLE.md: a feature is a module with a narrow hook into the loop, not a fork of it)."""

from __future__ import annotations

import ast
from pathlib import Path

import toolgrpo

PACKAGE = Path(toolgrpo.__file__).parent
TRAINER = PACKAGE / "trainer"
PREFIX = "toolgrpo.trainer"
MAX_LINES = 400


def _trainer_modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(TRAINER.glob("*.py")) if p.stem != "__init__"}


def _imported(node: ast.AST, names: set[str]) -> set[str]:
    """The trainer modules one import statement names (``from toolgrpo.trainer import state``,
    ``from toolgrpo.trainer.state import x``, ``import toolgrpo.trainer.state``, relative forms)."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if alias.name.startswith(PREFIX + ".") and parts[2] in names:
                found.add(parts[2])
    elif isinstance(node, ast.ImportFrom):
        if node.level == 1:  # from . import x / from .x import y, inside toolgrpo/trainer
            base = f"{PREFIX}.{node.module}" if node.module else PREFIX
        elif node.level == 0 and node.module:
            base = node.module
        else:
            return found
        if base == PREFIX:
            found |= {a.name for a in node.names if a.name in names}
        elif base.startswith(PREFIX + "."):
            mod = base.split(".")[2]
            if mod in names:
                found.add(mod)
    return found


def import_graph() -> dict[str, set[str]]:
    """Trainer module → the trainer modules it imports anywhere in its body."""
    modules = _trainer_modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            deps |= _imported(node, names)
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_cycle_finder_sees_a_circle_through_type_checking_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    src = "if TYPE_CHECKING:\n    from toolgrpo.trainer.x import X\n"
    (node,) = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)]
    assert _imported(node, {"x"}) == {"x"}
    (node,) = ast.parse("from toolgrpo.trainer import x as y, z").body
    assert _imported(node, {"x", "w"}) == {"x"}


def test_no_import_circle_inside_the_trainer_package():
    graph = import_graph()
    assert "trainer" in graph and graph["trainer"]  # the walk sees the loop's imports
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in toolgrpo/trainer: " + " -> ".join(cycle or [])


def test_no_module_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"

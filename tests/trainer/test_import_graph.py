"""No import circle anywhere in ``toolgrpo`` (imports inside functions and under
``TYPE_CHECKING`` included: a module that names another for its types, or imports it lazily to
dodge a circle, still depends on it), and no module grows past 400 lines (STYLE.md: a feature is a
module with a narrow hook into the loop, not a fork of it)."""

from __future__ import annotations

import ast
from pathlib import Path

import toolgrpo

PACKAGE = Path(toolgrpo.__file__).parent
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(known: set[str], base: str, name: str | None = None) -> str | None:
    """The module an import names: ``base.name`` when that is a module (``from pkg import mod``),
    else the longest module prefix of ``base`` (``from pkg.mod import Class``)."""
    if name is not None and f"{base}.{name}" in known:
        return f"{base}.{name}"
    while base and base not in known:
        base = base.rpartition(".")[0]
    return base or None


def imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The toolgrpo modules one import statement names (absolute and relative forms)."""
    found: set[str | None] = set()
    if isinstance(node, ast.Import):
        found |= {_target(known, a.name) for a in node.names if a.name.startswith("toolgrpo")}
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            pkg = module if is_package else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                pkg = pkg.rpartition(".")[0]
            base = f"{pkg}.{node.module}" if node.module else pkg
        else:
            base = node.module or ""
        if base == "toolgrpo" or base.startswith("toolgrpo."):
            found |= {_target(known, base, a.name) for a in node.names}
    return {m for m in found if m is not None and m != module}


def import_graph() -> dict[str, set[str]]:
    """Module -> the toolgrpo modules it imports anywhere in its body."""
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        pkg = path.name == "__init__.py"
        graph[name] = set().union(*(imported(n, name, pkg, known) for n in ast.walk(tree)))
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


def test_the_cycle_finder_sees_circles_through_lazy_relative_and_type_checking_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    known = {"toolgrpo.trainer", "toolgrpo.trainer.x", "toolgrpo.trainer.z", "toolgrpo.errors"}
    src = (
        "if TYPE_CHECKING:\n    from toolgrpo.trainer.x import X\n"
        "def f():\n    from . import z\n    from ..errors import E\n    import numpy\n"
    )
    got = set().union(
        *(imported(n, "toolgrpo.trainer.y", False, known) for n in ast.walk(ast.parse(src)))
    )
    assert got == {"toolgrpo.trainer.x", "toolgrpo.trainer.z", "toolgrpo.errors"}


def test_no_import_circle_anywhere_in_the_package():
    graph = import_graph()
    assert graph["toolgrpo.trainer.trainer"]  # the walk sees the loop's imports
    assert "toolgrpo.errors" in graph["toolgrpo.data.loader"]  # and resolves `from x import Y`
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_module_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"

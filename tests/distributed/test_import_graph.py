"""``toolgrpo.distributed``'s modules form no import circle, ``TYPE_CHECKING`` and function-level
imports included (the Ray pool builds its frontends; the frontends see the pool through a
protocol of what they call)."""

from __future__ import annotations

import ast
from pathlib import Path

import toolgrpo.distributed
from tests.trainer.test_import_graph import find_cycle

PACKAGE = Path(toolgrpo.distributed.__file__).parent
PREFIX = "toolgrpo.distributed."


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports anywhere in its body."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
                if node.module == PREFIX.rstrip("."):
                    mods = [f"{PREFIX}{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            deps |= {m.removeprefix(PREFIX).split(".")[0] for m in mods if m.startswith(PREFIX)}
        graph[name] = (deps & names) - {name}
    return graph


def test_no_import_circle_inside_the_distributed_package():
    graph = import_graph()
    assert "frontends" in graph["pool"] and "rank_failure" in graph["ranks"]  # the walk sees them
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in toolgrpo/distributed: " + " -> ".join(cycle or [])

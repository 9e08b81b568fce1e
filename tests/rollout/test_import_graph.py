"""The rollout package's modules form no import circle, ``TYPE_CHECKING`` imports included (the
loop and its between-turn helpers, an episode and its rollback rows, used to import each other)."""

from __future__ import annotations

import ast
from pathlib import Path

import toolgrpo
from tests.trainer.test_import_graph import find_cycle

PREFIX = "toolgrpo.rollout"
ROLLOUT = Path(toolgrpo.__file__).parent / "rollout"


def import_graph() -> dict[str, set[str]]:
    """Rollout module -> the rollout modules it imports anywhere in its body."""
    modules = {p.stem for p in ROLLOUT.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((ROLLOUT / f"{name}.py").read_text())
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == PREFIX:
                    deps |= {a.name for a in node.names if a.name in modules}
                elif node.module.startswith(PREFIX + "."):
                    deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names
                         if a.name.startswith(PREFIX + ".")}  # fmt: skip
        graph[name] = (deps & modules) - {name}
    return graph


def test_no_import_circle_inside_the_rollout_package():
    graph = import_graph()
    assert {"turns", "multi_turn", "episode", "rollback"} <= graph.keys() and graph["multi_turn"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in toolgrpo/rollout: " + " -> ".join(cycle or [])

"""Generated functions in ToolRL's RLLA prompt style: its own system prompt (taken from the
embedded RLLA rows, so the two never drift apart) with these functions in its tool list, and the
question as the dialogue history's one user turn."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

_LIST_HEAD = "In your response, you can use the following tools:\n"
_LIST_END = "\n\n**Steps for Each Turn**"


@functools.cache
def _frame() -> tuple[str, str]:
    """The RLLA system prompt before and after its tool list."""
    path = resources.files("toolgrpo.data").joinpath("rlla", "rlla_4k_test.jsonl")
    with path.open(encoding="utf-8") as f:
        system = json.loads(f.readline())["prompt"][0]["content"]
    head, end = system.index(_LIST_HEAD) + len(_LIST_HEAD), system.index(_LIST_END)
    return system[:head], system[end:]


def tool_listing(functions: list[dict[str, Any]]) -> str:
    """``1. Name: ...\\nDescription: ...\\nParameters: {...}`` as RLLA lists its tools (each
    parameter's schema, with ``"default": ""`` where it has none, as RLLA's rows do)."""
    lines = []
    for i, spec in enumerate(functions, 1):
        fn = spec["function"]
        props = {
            name: {**schema, "default": schema.get("default", "")}
            for name, schema in fn["parameters"]["properties"].items()
        }
        lines.append(
            f"{i}. Name: {fn['name']}\nDescription: {fn['description']}\n"
            f"Parameters: {json.dumps(props, ensure_ascii=False)}"
        )
    return "\n".join(lines)


def rlla_messages(functions: list[dict[str, Any]], question: str) -> tuple[dict[str, str], ...]:
    head, tail = _frame()
    return (
        {"role": "system", "content": head + tool_listing(functions) + tail},
        {"role": "user", "content": f"**Dialogue Records History**\n<user> {question} </user>"},
    )

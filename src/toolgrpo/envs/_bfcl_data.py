"""BFCL multi-turn entries, read from the installed ``bfcl-eval`` package at run time.

Only BFCL's multi-turn categories are read here: its single-turn categories are held-out evaluation
data and must never reach training. Train/test is split by scenario number (the same scenario
appears in every multi-turn category), so no variant of a test scenario is ever trained on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.errors import DataError

TASK_TYPE = "bfcl_multi_turn"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SPLITS = ("train", "test")
TEST_PERCENT = 20

SYSTEM_PROMPT = (
    "You are an assistant that carries out the user's requests by calling the functions you are "
    "given. Call a function by writing a JSON object inside tags, like "
    '<tool_call>{"name": "function_name", "arguments": {"param": "value"}}</tool_call>; one tag '
    "per call, several calls per reply are allowed. Use only the listed functions and parameter "
    "names. The results come back to you. Keep calling functions until the current request is "
    "done, then answer the user in plain text with no tool call: that ends your turn, and the user "
    "may ask something else. If no function fits, or a needed value is missing, say so instead of "
    "guessing."
)


@dataclass(frozen=True)
class BfclEntry:
    """One BFCL multi-turn test entry with its ground truth (BFCL's python-syntax calls)."""

    id: str
    turns: list[list[dict[str, str]]]  # user messages per turn; [] where functions are revealed
    initial_config: dict[str, Any]
    involved_classes: list[str]
    ground_truth: list[list[str]]
    missed_function: dict[str, list[str]] = field(default_factory=dict)  # turn -> names

    @property
    def category(self) -> str:
        return self.id.rsplit("_", 1)[0].removeprefix("multi_turn_")

    @property
    def scenario(self) -> int:
        return int(self.id.rsplit("_", 1)[1])

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category


def _bfcl() -> tuple[Any, Any]:
    """BFCL's path and name constants (these modules need none of its heavy dependencies)."""
    try:
        from bfcl_eval.constants import category_mapping, eval_config
    except ImportError as e:
        raise DataError(
            "BFCL tasks need the bfcl-eval package (pip install --no-deps bfcl-eval)"
        ) from e
    return category_mapping, eval_config


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@cache
def load_entries(category: str) -> tuple[BfclEntry, ...]:
    """Every entry of one multi-turn category, with its ground truth."""
    cm, cfg = _bfcl()
    if category not in CATEGORIES or f"multi_turn_{category}" not in cm.MULTI_TURN_CATEGORY:
        raise DataError(f"unknown BFCL multi-turn category {category!r}; have {CATEGORIES}")
    name = f"{cm.VERSION_PREFIX}_multi_turn_{category}.json"
    answers = {r["id"]: r["ground_truth"] for r in _read_jsonl(cfg.POSSIBLE_ANSWER_PATH / name)}
    entries = []
    for row in _read_jsonl(cfg.PROMPT_PATH / name):
        if not row["id"].startswith("multi_turn_"):  # never let a single-turn entry through
            raise DataError(f"{name}: {row['id']!r} is not a multi-turn entry")
        entries.append(
            BfclEntry(
                id=row["id"],
                turns=row["question"],
                initial_config=row.get("initial_config", {}),
                involved_classes=row["involved_classes"],
                ground_truth=answers[row["id"]],
                missed_function=row.get("missed_function", {}),
            )
        )
    return tuple(entries)


def entry_by_id(bfcl_id: str) -> BfclEntry:
    category = bfcl_id.rsplit("_", 1)[0].removeprefix("multi_turn_")
    for entry in load_entries(category):
        if entry.id == bfcl_id:
            return entry
    raise DataError(f"no BFCL multi-turn entry {bfcl_id!r}")


def is_consistent(entry: BfclEntry) -> bool:
    """False when the ground truth calls a held-back function before it is revealed (one miss_func
    entry does): no model could match it, so it is left out of the task lists."""
    reveal = {name: int(t) for t, names in entry.missed_function.items() for name in names}
    return all(
        reveal.get(call.split("(", 1)[0].strip(), 0) <= turn
        for turn, calls in enumerate(entry.ground_truth)
        for call in calls
    )


def split_of(entry: BfclEntry) -> str:
    """'test' for ~TEST_PERCENT% of scenarios, by a hash of the scenario number (stable forever)."""
    digest = hashlib.sha256(f"bfcl-scenario-{entry.scenario}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 100 < TEST_PERCENT else "train"


# ---- function docs → OpenAI function specs -------------------------------------------------------


@cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    _, cfg = _bfcl()
    return tuple(
        _read_jsonl(cfg.MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])
    )


def _json_schema(node: Any) -> Any:
    """BFCL's type names ("dict", "float", "tuple", "any") → JSON schema, recursively."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            if value.lower() != "any":  # "any" means no constraint, so no "type" at all
                out["type"] = GORILLA_TO_OPENAPI.get(value, "string")
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[key] = _json_schema(value)
        else:
            out[key] = value
    return out


def openai_spec(doc: dict[str, Any]) -> dict[str, Any]:
    params = _json_schema(doc.get("parameters") or {})
    params["type"] = "object"
    params.setdefault("properties", {})
    return {
        "type": "function",
        "function": {"name": doc["name"], "description": doc["description"], "parameters": params},
    }


def function_specs(entry: BfclEntry) -> tuple[list[dict[str, Any]], dict[int, list[dict]]]:
    """Specs shown from the start, and those held back until a later turn (miss_func)."""
    held = {name: int(t) for t, names in entry.missed_function.items() for name in names}
    shown: list[dict[str, Any]] = []
    later: dict[int, list[dict[str, Any]]] = {}
    for class_name in entry.involved_classes:
        for doc in func_docs(class_name):
            spec = openai_spec(doc)
            if doc["name"] in held:
                later.setdefault(held[doc["name"]], []).append(spec)
            else:
                shown.append(spec)
    return shown, later


# ---- tasks ---------------------------------------------------------------------------------------


def entry_to_task(entry: BfclEntry, source: str) -> Task:
    shown, _ = function_specs(entry)
    return Task(
        task_id=f"{source}#{entry.id}",
        messages=({"role": "system", "content": SYSTEM_PROMPT}, *entry.turns[0]),
        ground_truth=json.dumps(entry.ground_truth),
        data_source=TASK_TYPE,
        task_type=TASK_TYPE,
        tools=tuple(shown),
        meta={
            "bfcl_id": entry.id,
            "category": entry.category,
            "split": split_of(entry),
            "initial_config": entry.initial_config,
            "involved_classes": entry.involved_classes,
            "user_turns": entry.turns[1:],
            "missed_function": entry.missed_function,
        },
    )


def entry_from_task(task: Task) -> BfclEntry:
    """The entry a task was built from (from its meta, or looked up by its BFCL id)."""
    meta = task.meta
    bfcl_id = meta.get("bfcl_id") or task.task_id.rsplit("#", 1)[-1]
    if "initial_config" not in meta or "user_turns" not in meta:
        return entry_by_id(bfcl_id)
    first = [m for m in task.messages if m.get("role") == "user"]
    return BfclEntry(
        id=bfcl_id,
        turns=[first, *meta["user_turns"]],
        initial_config=meta["initial_config"],
        involved_classes=meta["involved_classes"],
        ground_truth=json.loads(task.ground_truth),
        missed_function=meta.get("missed_function", {}),
    )


def bfcl_tasks(spec: str) -> list[Task]:
    """Tasks for ``bfcl_multi_turn:<train|test>[:<category>,...]`` (all categories by default)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] != TASK_TYPE or parts[1] not in SPLITS:
        raise DataError(
            f"bad BFCL dataset name {spec!r}; use {TASK_TYPE}:train or {TASK_TYPE}:test, "
            f"optionally with :<category>[,<category>] from {', '.join(CATEGORIES)}"
        )
    categories = parts[2].split(",") if len(parts) == 3 else list(CATEGORIES)
    return [
        entry_to_task(entry, spec)
        for category in categories
        for entry in load_entries(category.strip())
        if split_of(entry) == parts[1] and is_consistent(entry)
    ]

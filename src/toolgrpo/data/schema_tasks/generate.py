"""Seeded tool-calling tasks over generated function schemas: ``schemas:test`` (held-out families)
and ``schemas:train``.

Each item draws functions from the split's families (a name, description, parameter names and
order per draw), a call type — ``simple`` (one function offered, one call), ``multiple`` (several
offered, one call), ``parallel`` (one offered, several calls), ``parallel_multiple`` (several
offered, calls to two of them) — and argument values the question states in words, so the
expected call set is known. The same item is rendered in both prompt styles the project trains:
``native`` (the tokenizer's ``tools=``, hermes calls; task type ``schemas``) and ``rlla`` (ToolRL's
system prompt listing the tools, calls as ``{"name", "parameters"}`` lines; ``schemas_rlla``).
The ground truth holds the expected calls and the offered schemas (the matcher needs which
arguments are optional and their defaults).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from toolgrpo.data.schema_tasks.catalog_test import TEST_ARCHETYPES
from toolgrpo.data.schema_tasks.catalog_train import TRAIN_ARCHETYPES
from toolgrpo.data.schema_tasks.spec import Archetype, Param
from toolgrpo.data.schema_tasks.values import POOLS
from toolgrpo.data.task import Task

CALL_TYPES = ("simple", "multiple", "parallel", "parallel_multiple")
STYLES = ("native", "rlla")
TASK_TYPES = {"native": "schemas", "rlla": "schemas_rlla"}
SPLITS = {"train": (TRAIN_ARCHETYPES, 1_000_003, 1200), "test": (TEST_ARCHETYPES, 7_777_019, 240)}
NATIVE_SYSTEM = (
    "You are a helpful assistant with access to functions. When the user's request needs them, "
    "call the functions with the argument names and types their signatures give; state only "
    "the arguments the request implies."
)
_JSON_TYPES = {"enum": "string"}


@dataclass(frozen=True)
class Function:
    """One drawn function: its spec's name and parameters, and its archetype's params in the
    drawn order, each with its drawn name."""

    name: str
    description: str
    params: tuple[tuple[str, Param], ...]
    ask: str

    def spec(self) -> dict[str, Any]:
        """The OpenAI function spec (``tools=``)."""
        props = {name: _schema(p) for name, p in self.params}
        required = [name for name, p in self.params if p.required]
        parameters = {"type": "object", "properties": props, "required": required}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }


def draw_function(arch: Archetype, rng: random.Random) -> Function:
    """A schema of ``arch``: restyled name (snake, camel or dotted), drawn parameter names,
    shuffled parameter order."""
    stem = rng.choice(arch.names)
    style = rng.random()
    if style < 0.35:
        name = stem
    elif style < 0.65:
        head, *rest = stem.split("_")
        name = head + "".join(w.capitalize() for w in rest)
    else:
        name = f"{rng.choice(arch.namespaces or ('api',))}.{stem}"
    params = [(rng.choice(p.names), p) for p in arch.params]
    order = list(range(len(params)))
    rng.shuffle(order)
    return Function(
        name,
        rng.choice(arch.descs),
        tuple(params[i] for i in order),
        rng.choice(arch.asks),
    )


def draw_call(fn: Function, arch: Archetype, rng: random.Random) -> tuple[dict[str, Any], str]:
    """An expected call of ``fn`` and the words that state it (the archetype's phrase order)."""
    names = {id(p): n for n, p in fn.params}
    args: dict[str, Any] = {}
    phrases: list[str] = []
    used: set[str] = set()  # two parameters of one pool (origin, destination) never coincide
    for p in arch.params:
        if not p.required and rng.random() < 0.5:
            continue
        value, words = _value(p, rng, used)
        args[names[id(p)]] = value
        phrases.append(words)
    return {"name": fn.name, "arguments": args}, " ".join(phrases)


def _value(p: Param, rng: random.Random, used: set[str]) -> tuple[Any, str]:
    if p.kind == "object":
        parts = [_value(f, rng, used) for f in p.fields]
        value = {f.names[0]: v for f, (v, _) in zip(p.fields, parts, strict=True)}
        return value, p.phrase.format(*(w for _, w in parts))
    if p.kind == "boolean":
        v = rng.random() < 0.5
        return v, p.phrase if v else p.phrase_false
    if p.kind == "array":
        k = rng.randint(*p.size)
        items = rng.sample([v for v in POOLS[p.pool] if v not in used], k)
        used.update(items)
        words = items[0] if k == 1 else ", ".join(items[:-1]) + " and " + items[-1]
        return items, p.phrase.format(v=words)
    if p.kind == "enum":
        v = rng.choice(p.enum)
    elif p.kind == "integer":
        v = rng.randint(int(p.low), int(p.high))
    elif p.kind == "number":
        v = round(rng.uniform(p.low, p.high), p.decimals)
        v = int(v) if p.decimals == 0 else v
    else:
        v = rng.choice([v for v in POOLS[p.pool] if v not in used])
        used.add(v)
    return v, p.phrase.format(v=v)


def _schema(p: Param) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _JSON_TYPES.get(p.kind, p.kind), "description": p.desc}
    if p.kind == "enum":
        out["enum"] = list(p.enum)
    if p.kind == "array":
        out["items"] = {"type": "string"}
    if p.kind == "object":
        out["properties"] = {f.names[0]: _schema(f) for f in p.fields}
        out["required"] = [f.names[0] for f in p.fields]
    if not p.required:
        out["default"] = p.default
    return out


def draw_item(archetypes: tuple[Archetype, ...], call_type: str, rng: random.Random) -> dict:
    """One item: the offered specs, the expected calls and the question."""
    n_offered = {"simple": 1, "parallel": 1}.get(call_type, rng.randint(2, 4))
    picks = rng.sample(range(len(archetypes)), n_offered)
    fns = [draw_function(archetypes[i], rng) for i in picks]
    if call_type in ("simple", "multiple"):
        target = rng.randrange(n_offered)
        call, words = draw_call(fns[target], archetypes[picks[target]], rng)
        calls, question = [call], f"{fns[target].ask} {words}."
    elif call_type == "parallel":
        drawn = [draw_call(fns[0], archetypes[picks[0]], rng) for _ in range(rng.randint(2, 3))]
        calls = [c for c, _ in drawn]
        question = f"{fns[0].ask} {', and also '.join(w for _, w in drawn)}."
    else:
        two = rng.sample(range(n_offered), 2)
        drawn = [draw_call(fns[i], archetypes[picks[i]], rng) for i in two]
        calls = [c for c, _ in drawn]
        question = " Also: ".join(
            f"{fns[i].ask} {w}." for i, (_, w) in zip(two, drawn, strict=True)
        )
    if len({json.dumps(c, sort_keys=True) for c in calls}) < len(calls):  # a repeated call
        return draw_item(archetypes, call_type, rng)
    return {"functions": [f.spec() for f in fns], "calls": calls, "question": question}


def generate_items(split: str, n: int | None = None, seed: int | None = None) -> list[dict]:
    """``n`` items of ``split`` (call types in turn), the same for the same arguments."""
    archetypes, default_seed, default_n = SPLITS[split]
    rng = random.Random(default_seed if seed is None else seed)
    count = default_n if n is None else n
    return [draw_item(archetypes, CALL_TYPES[i % len(CALL_TYPES)], rng) for i in range(count)]


def item_task(item: dict, index: int, split: str, style: str, source: str) -> Task:
    """``item`` as a task in ``style``; ids ``<source>#<style>-<index>``."""
    call_type = CALL_TYPES[index % len(CALL_TYPES)]
    truth = json.dumps({"calls": item["calls"], "functions": item["functions"]})
    if style == "native":
        messages = (
            {"role": "system", "content": NATIVE_SYSTEM},
            {"role": "user", "content": item["question"]},
        )
        tools = tuple(item["functions"])
    else:
        from toolgrpo.data.schema_tasks.rlla_style import rlla_messages

        messages, tools = rlla_messages(item["functions"], item["question"]), ()
    return Task(
        task_id=f"{source}#{style}-{index}",
        messages=messages,
        ground_truth=truth,
        data_source="schemas",
        task_type=TASK_TYPES[style],
        tools=tools,
        meta={"index": f"{style}-{index}", "split": split, "call_type": call_type, "style": style},
    )

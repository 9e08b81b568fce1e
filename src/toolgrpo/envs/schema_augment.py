"""Schema augmentation: a training episode offers its environment's tools under drawn names.

A model trained on three fixed tools (``calculate``, ``search``, ``solve``) learns their names and
argument names by heart, and loses calls to tools it has never seen (docs/learning.md, "Calls to
tools it never saw"). Here a training task's episodes (all of its GRPO group alike) may see each
tool under another name (a synonym or a restyled stem: snake, camel or dotted), each argument
under another name, the tools and their arguments in another order, and the opening prompt's
example call rewritten to match (only system messages are rewritten, and only quoted names in
them): what to call is only in the tool listing, so the model must read it. Calls are translated
back before the environment runs them; a call to a name or an argument the episode did not offer
(the tool's usual name, say) is an ``unknown_tool`` /
``invalid_arguments`` error naming what it offers, never run. Descriptions and the tools
themselves are unchanged, as are the reward and snapshots (the environment is the same object;
its ``reset`` and ``step`` are wrapped on the instance, as ``envs.concurrency.hold_slot`` does).

Draws are seeded by (``trainer.seed``, step, task id): reproducible, the same for a task's whole
group and for fission's continuations, new each time a task comes back. Validation and
``toolgrpo eval`` play the tools under their own names.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from toolgrpo.envs.base import Env, EnvStart
from toolgrpo.tools.types import ToolCall, ToolResult

# Other names of the built-in environments' tools and arguments; any other name is restyled.
TOOL_SYNONYMS = {
    "calculate": ("evaluate", "compute", "calc", "evaluate_expression", "math_eval", "arithmetic"),
    "solve": ("solve_equation", "find_root", "equation_solver", "solve_for", "algebra_solve"),
    "search": ("lookup", "find_passages", "search_documents", "query_corpus", "retrieve"),
    "open_document": ("read_document", "get_document", "fetch_doc", "open_doc", "show_document"),
}
PARAM_SYNONYMS = {
    "expression": ("expr", "formula", "math_expression", "input", "arithmetic"),
    "equation": ("eq", "equation_text", "formula", "expression"),
    "variable": ("var", "unknown", "symbol", "solve_for"),
    "query": ("q", "search_query", "keywords", "text", "terms"),
    "doc_id": ("document_id", "id", "doc", "document"),
}
NAMESPACES = ("api", "tools", "utils", "service", "functions")


@dataclass(frozen=True)
class Renaming:
    """One episode's names: offered tool name -> the environment's, and per offered tool its
    offered argument names -> the environment's."""

    tools: dict[str, str]
    params: dict[str, dict[str, str]]

    def offered_tool(self, env_name: str) -> str:
        return next(k for k, v in self.tools.items() if v == env_name)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _tool_name(name: str, rng: random.Random) -> str:
    stem = rng.choice((name, *TOOL_SYNONYMS.get(name, (f"{name}_tool", f"run_{name}"))))
    style = rng.random()
    if style < 0.4:
        return stem
    if style < 0.7:
        return _camel(stem)
    return f"{rng.choice(NAMESPACES)}.{stem}"


def _param_name(name: str, rng: random.Random, camel: bool) -> str:
    stem = rng.choice((name, *PARAM_SYNONYMS.get(name, (f"{name}_value", f"input_{name}"))))
    return _camel(stem) if camel else stem


def _unique(draw: Any, taken: set[str], fallback: str) -> str:
    for _ in range(8):
        name = draw()
        if name not in taken:
            taken.add(name)
            return name
    taken.add(fallback)  # an environment's own names are distinct
    return fallback


def draw_renaming(specs: list[dict[str, Any]], rng: random.Random) -> Renaming:
    """New names for the tools of ``specs`` (OpenAI function specs) and their arguments."""
    tools: dict[str, str] = {}
    params: dict[str, dict[str, str]] = {}
    taken: set[str] = set()
    for spec in specs:
        fn = spec["function"]
        new = _unique(lambda fn=fn: _tool_name(fn["name"], rng), taken, fn["name"])
        tools[new] = fn["name"]
        camel, used = rng.random() < 0.3, set[str]()
        props = (fn.get("parameters") or {}).get("properties") or {}
        params[new] = {
            _unique(lambda p=p, c=camel: _param_name(p, rng, c), used, p): p for p in props
        }
    return Renaming(tools, params)


def renamed_specs(specs: list[dict[str, Any]], r: Renaming, rng: random.Random) -> list[dict]:
    """``specs`` under ``r``'s names, tools and arguments in a drawn order."""
    out = []
    for new, env_name in r.tools.items():
        spec = next(s for s in specs if s["function"]["name"] == env_name)
        fn = dict(spec["function"], name=new)
        schema = dict(fn.get("parameters") or {})
        props = schema.get("properties") or {}
        offered = {v: k for k, v in r.params[new].items()}  # env arg -> offered arg
        order = list(props)
        rng.shuffle(order)
        schema["properties"] = {offered[p]: props[p] for p in order}
        if "required" in schema:
            schema["required"] = [offered[p] for p in schema["required"] if p in offered]
        if "parameters" in fn:
            fn["parameters"] = schema
        out.append(dict(spec, function=fn))
    rng.shuffle(out)
    return out


def rewrite_text(text: str, r: Renaming) -> str:
    """``text`` with every quoted environment name (a JSON example call's ``"calculate"`` and
    ``"expression"``, an error's ``'expression'``) replaced by the episode's; unquoted words are
    left alone."""
    pairs = [(env, new) for new, env in r.tools.items()]
    pairs += [(env, new) for args in r.params.values() for new, env in args.items()]
    swaps = {f"{q}{env}{q}": f"{q}{new}{q}" for env, new in pairs for q in "\"'"}
    out, i = [], 0
    while i < len(text):  # one pass, so a swap's output is never swapped again
        hit = next((k for k in swaps if text.startswith(k, i)), None)
        out.append(swaps[hit] if hit else text[i])
        i += len(hit) if hit else 1
    return "".join(out)


def translate(call: ToolCall, r: Renaming) -> ToolCall | ToolResult:
    """``call`` in the environment's names, or the error result the model reads instead."""
    if call.parse_error is not None:
        return call  # the environment says what it says of an unparsed block
    if call.name not in r.tools:
        text = f"Error: unknown tool '{call.name}'. Available tools: {', '.join(r.tools)}"
        return ToolResult(text, True, "unknown_tool", call.name, call.id)
    names = r.params[call.name]
    extra = sorted(set(call.arguments) - set(names))
    if extra:
        text = (
            f"Error: invalid arguments for tool '{call.name}': unexpected argument "
            f"'{extra[0]}' (its arguments: {', '.join(names) or 'none'})"
        )
        return ToolResult(text, True, "invalid_arguments", call.name, call.id)
    args = {names[k]: v for k, v in call.arguments.items()}
    return ToolCall(r.tools[call.name], args, call.raw, None, call.id)


def augment(env: Env, rng: random.Random) -> Env:
    """``env`` with its ``reset`` and ``step`` offering drawn names (module docstring); an
    environment that owns its turn, or offers no tools, plays as it is."""
    if env.owns_turn:
        return env
    reset, step = env.reset, env.step
    names: list[Renaming] = []

    async def renamed_reset() -> EnvStart:
        start = await reset()
        if not start.tools:
            return start
        r = draw_renaming(start.tools, rng)
        names[:] = [r]
        messages = [
            dict(m, content=rewrite_text(m["content"], r))
            if isinstance(m.get("content"), str) and m.get("role") == "system"
            else m
            for m in start.messages
        ]
        return EnvStart(messages, renamed_specs(start.tools, r, rng))

    async def renamed_step(calls: list[ToolCall]) -> list[ToolResult]:
        if not names:
            return await step(calls)
        r = names[0]
        parts = [translate(c, r) for c in calls]
        runs = [p for p in parts if isinstance(p, ToolCall)]
        ran = iter(await step(runs) if runs else [])
        out = []
        for p in parts:
            if isinstance(p, ToolResult):
                out.append(p)
                continue
            res = next(ran)
            name = r.offered_tool(res.name) if res.name in r.tools.values() else res.name
            out.append(_renamed_result(res, name, r))
        return out

    env.reset = renamed_reset  # type: ignore[method-assign]
    env.step = renamed_step  # type: ignore[method-assign]
    return env


def _renamed_result(res: ToolResult, name: str, r: Renaming) -> ToolResult:
    """A result as the episode names things: its tool's offered name, and quoted environment
    names in an error's text (``missing argument "expression"``) swapped too."""
    text = rewrite_text(res.text, r) if res.is_error else res.text
    return replace(res, name=name, text=text)


def episode_rng(seed: int, step: int, task_id: str) -> random.Random:
    """The draws of one task's episodes at ``step`` (the same for its whole group)."""
    return random.Random(f"schema_augmentation:{seed}:{step}:{task_id}")

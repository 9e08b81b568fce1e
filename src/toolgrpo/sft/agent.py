"""Agent SFT rows: complete episodes played in the real environments with gold tool calls.

Each gold call is written as the model should write it (a hermes ``<tool_call>`` block), parsed by
the same parser the episode loop uses, and run by the environment itself; its result becomes the
``tool`` message, and the episode ends with the final answer, which the environment's own reward
must score as full marks. Rows keep the opening messages before tool rendering plus the ``tools``
specs, so ``sft.data`` renders them exactly as ``rollout.render.with_tools`` does for the model at
hand. Turns are the episode loop's messages (``rollout.turns``): the text as written plus the
structured ``tool_calls``, and tool results naming the call they answer (``tool_call_id``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from toolgrpo.data.loader import embedded_path, prompt_key, read_rows
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvStart, Transcript
from toolgrpo.rollout.turns import assistant_message, result_call_ids
from toolgrpo.tools.parser import parse_tool_calls
from toolgrpo.tools.types import ToolResult

# Environments whose test splits must never reach SFT data.
ENV_TEST_SETS = ("calculator", "search", "direct")


class GoldError(ValueError):
    """A gold episode that does not play as planned (a call fails, the reward is not full)."""


@dataclass(frozen=True)
class GoldCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class GoldEpisode:
    messages: list[dict[str, Any]]  # opening messages (before tool rendering), then the turns
    tools: list[dict[str, Any]]  # the ``tools=`` specs the episode opened with
    reward: float
    results: list[list[ToolResult]] = field(default_factory=list)  # per tool turn


def call_text(calls: Sequence[GoldCall]) -> str:
    """One assistant turn's calls, as hermes blocks (the format ``rollout.render`` asks for)."""
    return "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
        + "\n</tool_call>"
        for c in calls
    )


def answer_text(answer: str) -> str:
    return f"<answer>{answer}</answer>"


async def play_gold(
    env: Env,
    turns: Sequence[Sequence[GoldCall]],
    answer: str,
    condition: Callable[[EnvStart], EnvStart] | None = None,
    full_marks: float = 1.0,
    check: Callable[[int, list[ToolResult]], bool] | None = None,
) -> GoldEpisode:
    """Play ``turns`` of gold calls then ``answer`` in ``env``; raise ``GoldError`` if a call is
    not parsed back as written, a tool reports an error, ``check(turn, results)`` refuses a
    turn's results, the episode needs more turns than the env allows, or the reward is short of
    ``full_marks``."""
    if len(turns) + 1 > env.max_turns:
        raise GoldError(f"{len(turns) + 1} turns but the environment allows {env.max_turns}")
    start = await env.reset()
    if condition is not None:
        start = condition(start)
    offered = {str((s.get("function") or s).get("name")) for s in start.tools}
    messages = [dict(m) for m in start.messages]
    all_results = []
    for n, turn in enumerate(turns):
        text = call_text(turn)
        parsed = parse_tool_calls(text)
        if [(c.name, c.arguments) for c in parsed] != [(c.name, c.arguments) for c in turn]:
            raise GoldError(f"turn {n}: {text!r} does not parse back as written")
        missing = {c.name for c in turn} - offered
        if missing:
            raise GoldError(f"turn {n}: tool(s) {sorted(missing)} not offered")
        results = await env.step(parsed)
        bad = [r for r in results if r.is_error]
        if bad:
            raise GoldError(f"turn {n}: {bad[0].error_type}: {bad[0].text[:200]}")
        if check is not None and not check(n, results):
            raise GoldError(f"turn {n}: the results miss what the next step needs")
        turn_message = assistant_message(text, parsed, messages)
        messages.append(turn_message)
        ids = result_call_ids(turn_message.get("tool_calls") or [], parsed, results)
        messages.extend(_tool_message(r, i) for r, i in zip(results, ids, strict=True))
        all_results.append(results)
    messages.append({"role": "assistant", "content": answer_text(answer)})
    r = await env.reward(Transcript(list(messages), "", "answer", len(turns) + 1))
    if not r.score >= full_marks:
        raise GoldError(f"reward {r.score} < {full_marks} for answer {answer!r}")
    return GoldEpisode(messages, [dict(s) for s in start.tools], float(r.score), all_results)


def _tool_message(r: ToolResult, call_id: str) -> dict[str, Any]:
    """A result as the episode loop's tool message (``rollout.turns.tool_message``), whole."""
    msg = {"role": "tool", "name": r.name, "content": r.text}
    return {**msg, "tool_call_id": call_id} if call_id else msg


def agent_row(task: Task, ep: GoldEpisode, route: str | None) -> dict[str, Any]:
    """A message-JSONL SFT row (``sft.data`` trains on its assistant turns)."""
    return {
        "messages": ep.messages,
        "tools": ep.tools,
        "meta": {
            "task_id": task.task_id,
            "task_type": task.task_type,
            "route": route or "",
            "tool_turns": len(ep.results),
        },
    }


@lru_cache(maxsize=1)
def env_test_prompts() -> frozenset[str]:
    """Prompt keys (user turns) of the embedded calculator/search/direct test splits."""
    keys = set()
    for env in ENV_TEST_SETS:
        for row in read_rows(embedded_path(f"{env}_test.jsonl", "envs")):
            if isinstance(row, dict):
                keys.add(prompt_key(m["content"] for m in row["prompt"] if m["role"] == "user"))
    return frozenset(keys)

"""Questions answered from the prompt alone (small arithmetic, facts stated in the question).

By default no tools are offered: this is the task set where the router's ANSWER route is right. A
tool call the model writes anyway comes back as an ``unknown_tool`` error and counts as a tool
error. With ``offer_tools`` the episode offers the calculator's and/or search's real tools (same
names and specs, so the router's families know them) although the question needs none: a call
runs, costs under the router, and cannot help. The reward is 1 for the right final ``<answer>``
(numbers compared as numbers, text after SQuAD normalisation), else 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.calculator import (
    calculator_tools,
    check_options,
    final_answer,
    numbers_match,
    parse_number,
    with_system,
)
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.search import load_index, normalize_answer, search_tools
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.tools.schema import Tool

SYSTEM_PROMPT = (
    "You are a careful assistant. Everything you need is in the question: work it out yourself. "
    "Reply with the final answer only, as <answer>ANSWER</answer> (a number or a short phrase)."
)
OPTIONS = ("offer_tools", "timeout_s")
TOOL_SETS = ("calculator", "search")  # the environments whose tools ``offer_tools`` can lend
_USES = {
    "calculator": "calculate (arithmetic) and solve (equations)",
    "search": "search and open_document (a document collection)",
}
_EXAMPLES = {
    "calculator": '{"name": "calculate", "arguments": {"expression": "4817 * 293"}}',
    "search": '{"name": "search", "arguments": {"query": "mayor of Varneth"}}',
}


def tools_prompt(sets: tuple[str, ...]) -> str:
    """A neutral system prompt for an episode offering ``sets``' tools: it neither asks for a call
    nor forbids one, so whether a tool is worth calling is the policy's (and router's) call. Every
    sentence about tools mentions them, so the router's ANSWER route can drop them all."""
    return (
        f"You are a careful assistant. You may use tools: {'; '.join(_USES[s] for s in sets)}. "
        "Call a tool only when you cannot work the answer out reliably yourself.\n"
        "To call a tool, write one block per call:\n"
        f"<tool_call>{_EXAMPLES[sets[0]]}</tool_call>\n"
        "Tool results come back in the next message. Reply with the final answer only, as "
        "<answer>ANSWER</answer> (a number or a short phrase)."
    )


@lru_cache(maxsize=1)
def _search_tools() -> tuple[Tool, ...]:
    return search_tools(load_index())  # the shipped corpus, the search env's defaults


def offered_tools(sets: tuple[str, ...]) -> tuple[Tool, ...]:
    """The real tools of the ``calculator`` / ``search`` environments, as those offer them."""
    by_set = {"calculator": calculator_tools, "search": _search_tools}
    return tuple(t for s in sets for t in by_set[s]())


def number_option(
    env: str, options: Mapping[str, Any], key: str, default: float, minimum: float
) -> float:
    value = options.get(key, default)
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number <= minimum:
        raise EnvConfigError(f"{env} option {key} must be a number > {minimum:g}, got {value!r}")
    return number


def parse_options(options: Mapping[str, Any]) -> tuple[tuple[str, ...], float]:
    """(tool sets to offer, per-call timeout); ``EnvConfigError`` names a bad value."""
    check_options("direct", options, OPTIONS)
    value = options.get("offer_tools", False)
    if isinstance(value, bool):
        sets = TOOL_SETS if value else ()
    elif isinstance(value, (list, tuple)) and all(v in TOOL_SETS for v in value):
        sets = tuple(s for s in TOOL_SETS if s in value)
    else:
        raise EnvConfigError(
            f"direct option offer_tools must be true, false or a list of {list(TOOL_SETS)}, "
            f"got {value!r}"
        )
    return sets, number_option("direct", options, "timeout_s", 10.0, 0.0)


def answers_match(answer: str, ground_truth: str) -> bool:
    """Numbers by value (``7`` = ``7.0``), anything else by normalised text."""
    if parse_number(ground_truth) is not None:
        return numbers_match(answer, ground_truth)
    return bool(normalize_answer(answer)) and normalize_answer(answer) == normalize_answer(
        ground_truth
    )


def direct_reward(transcript: Transcript, ground_truth: str) -> EnvReward:
    answer = final_answer(transcript.messages)
    correct = answer is not None and answers_match(answer, ground_truth)
    return EnvReward(
        float(correct), {"correct": float(correct), "has_answer": float(answer is not None)}
    )


@register_env("direct")
def make_direct_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """Options: ``offer_tools`` (false; true = the calculator's and search's tools, or a list
    such as ``[calculator]``), ``timeout_s`` per tool call (10). ``max_turns`` is set by the
    router (2 by default: a turn after a tool call lets the model still answer)."""
    sets, timeout_s = parse_options(options)
    messages = with_system(task.messages, tools_prompt(sets) if sets else SYSTEM_PROMPT)
    if not sets:
        return ToolEnv(messages, (), lambda t: direct_reward(t, task.ground_truth), stateless=True)
    return ToolEnv(
        messages,
        offered_tools(sets),
        lambda t: direct_reward(t, task.ground_truth),
        timeout_s=timeout_s,
        stateless=True,  # pure tools: rollback needs no state saved
        reward_range=(0.0, 1.0),
    )


make_direct_env.validate_options = parse_options  # type: ignore[attr-defined]  # at startup

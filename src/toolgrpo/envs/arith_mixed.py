"""Arithmetic where the calculator helps only sometimes: the task type on which a router's tool
choice matters per question, not per task type.

Half the questions are easy without a tool (single-digit sums and products, or a multi-digit
result stated in the question), half need one (multi-digit products and divisions); every episode
offers the calculator's real tools under one system prompt, so only the question tells them apart.
Each row's ``extra_info.needs_tool`` (``Task.meta["needs_tool"]``) says which half it is, for
scoring the router's choice against it (``needs_tool``, AUROC). The reward is 1 when the final
``<answer>`` equals the integer answer exactly: the calculator's relative tolerance (1e-6) would
pass a 7-digit product off by a few units, a near miss that must not pass for doing it unaided.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.calculator import (
    calculator_tools,
    check_options,
    final_answer,
    parse_number,
    with_system,
)
from toolgrpo.envs.direct import number_option, tools_prompt
from toolgrpo.envs.registry import register_env
from toolgrpo.envs.tool_env import ToolEnv

OPTIONS = ("timeout_s",)
# The prompt of ``direct`` with offer_tools=[calculator]: only the question tells the two apart.
SYSTEM_PROMPT = tools_prompt(("calculator",))
# Task types whose every task needs a tool, or none does (``needs_tool`` without a row label).
_TYPE_NEEDS_TOOL = {"calculator": True, "search": True, "direct": False}


def needs_tool(task: Task) -> bool | None:
    """Whether ``task`` needs a tool: its row's label (``arith_mixed``), else its task type's
    (calculator, search: yes; direct: no, even with ``offer_tools``); ``None`` if unknown."""
    label = task.meta.get("needs_tool")
    if isinstance(label, bool):
        return label
    return _TYPE_NEEDS_TOOL.get(task.task_type)


def arith_reward(transcript: Transcript, ground_truth: str) -> EnvReward:
    """1 for the exact number (``1,234`` and ``1234.0`` are 1234), else 0."""
    answer = final_answer(transcript.messages)
    got = parse_number(answer) if answer is not None else None
    correct = got is not None and got == parse_number(ground_truth)
    return EnvReward(
        float(correct), {"correct": float(correct), "has_answer": float(answer is not None)}
    )


def parse_options(options: Mapping[str, Any]) -> float:
    """The per-call timeout; ``EnvConfigError`` names a bad option."""
    check_options("arith_mixed", options, OPTIONS)
    return number_option("arith_mixed", options, "timeout_s", 10.0, 0.0)


@register_env("arith_mixed")
def make_arith_mixed_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """Options: ``timeout_s`` per tool call (10)."""
    return ToolEnv(
        with_system(task.messages, SYSTEM_PROMPT),
        calculator_tools(),
        lambda t: arith_reward(t, task.ground_truth),
        timeout_s=parse_options(options),
        stateless=True,  # pure tools: rollback needs no state saved
        reward_range=(0.0, 1.0),  # correct or not
    )


make_arith_mixed_env.validate_options = parse_options  # type: ignore[attr-defined]

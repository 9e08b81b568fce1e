"""Questions answered from the prompt alone (small arithmetic, facts stated in the question).

No tools are offered: this is the task set where the router's ANSWER route is right. A tool call
the model writes anyway comes back as an ``unknown_tool`` error and counts as a tool error. The
reward is 1 for the right final ``<answer>`` (numbers compared as numbers, text after SQuAD
normalisation), else 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.calculator import (
    check_options,
    final_answer,
    numbers_match,
    parse_number,
    with_system,
)
from toolgrpo.envs.registry import register_env
from toolgrpo.envs.search import normalize_answer
from toolgrpo.envs.tool_env import ToolEnv

SYSTEM_PROMPT = (
    "You are a careful assistant. Everything you need is in the question: work it out yourself. "
    "Reply with the final answer only, as <answer>ANSWER</answer> (a number or a short phrase)."
)


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
    """No options besides ``max_turns`` (set by the router; a turn after a stray tool call lets
    the model still answer)."""
    check_options("direct", options, ())
    return ToolEnv(
        with_system(task.messages, SYSTEM_PROMPT),
        (),
        lambda t: direct_reward(t, task.ground_truth),
        stateless=True,
    )

"""reasoning-gym tasks as episodes: the calculator's tools, the final ``<answer>`` scored by the
dataset's own verifier (``score_answer``, 0..1, partial credit where the dataset gives it).

Config (optional; tasks come from ``reasoning_gym:<dataset>`` data sources)::

    reasoning_gym: {max_turns: 4, calculator: true, timeout_s: 10}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from toolgrpo.data.reasoning_gym import RGSource, rg_dataset, rg_entry
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.calculator import calculator_tools, check_options, final_answer, with_system
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.tools.isolated import DEFAULT_MEMORY_LIMIT_MB

SYSTEM_PROMPT = (
    "You are a careful problem solver. Do not compute large numbers in your head: use the tools.\n"
    "To call a tool, write one block per call:\n"
    '<tool_call>{"name": "calculate", "arguments": {"expression": "4817 * 293 - 1205"}}'
    "</tool_call>\n"
    "Tool results come back in the next message. When you know the result, reply with the final "
    "answer only, in the form the question asks for, as <answer>ANSWER</answer>."
)
SYSTEM_PROMPT_NO_TOOLS = (
    "You are a careful problem solver. Reply with the final answer only, in the form the question "
    "asks for, as <answer>ANSWER</answer>."
)
OPTIONS = ("calculator", "timeout_s", "memory_limit_mb")


def reasoning_gym_reward(transcript: Transcript, source: RGSource, index: int) -> EnvReward:
    """The dataset's own score of the last ``<answer>`` (no answer: scored as ``None``)."""
    answer = final_answer(transcript.messages)
    score = float(rg_dataset(source).score_answer(answer, rg_entry(source, index)))
    if not math.isfinite(score):
        raise ValueError(f"reasoning-gym scored {score} for {source.dataset} item {index}")
    parts = {"exact": float(score >= 1.0), "has_answer": float(answer is not None)}
    return EnvReward(score, parts)


def _options(options: Mapping[str, Any]) -> tuple[bool, float, float]:
    check_options("reasoning_gym", options, OPTIONS)
    calculator = options.get("calculator", True)
    if not isinstance(calculator, bool):
        raise EnvConfigError(
            f"reasoning_gym option calculator must be true or false, got {calculator!r}"
        )
    numbers = []
    for key, default in (("timeout_s", 10.0), ("memory_limit_mb", DEFAULT_MEMORY_LIMIT_MB)):
        value = options.get(key, default)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            raise EnvConfigError(f"reasoning_gym option {key} must be a number >= 0, got {value!r}")
        numbers.append(float(value))
    return calculator, numbers[0], numbers[1]


@register_env("reasoning_gym")
def make_reasoning_gym_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """Options: ``calculator`` (default true: offer ``calculate`` and ``solve``), ``timeout_s``
    per tool call (default 10), ``memory_limit_mb`` a ``solve`` call may add (default 1024)."""
    calculator, timeout_s, memory_limit_mb = _options(options)
    try:
        source = RGSource.from_meta(task.meta.get("reasoning_gym"))
    except (KeyError, TypeError, ValueError) as e:
        raise EnvConfigError(
            f"task {task.task_id!r} of type reasoning_gym has no reasoning-gym source ({e}); load "
            "it from data.train_files=[reasoning_gym:<dataset>]"
        ) from e
    index = int(task.meta["index"])
    return ToolEnv(
        with_system(task.messages, SYSTEM_PROMPT if calculator else SYSTEM_PROMPT_NO_TOOLS),
        calculator_tools() if calculator else (),
        lambda t: reasoning_gym_reward(t, source, index),
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        stateless=True,  # pure tools: rollback needs no state saved
        reward_range=(0.0, 1.0),  # score_answer's range
    )


make_reasoning_gym_env.validate_options = _options  # type: ignore[attr-defined]

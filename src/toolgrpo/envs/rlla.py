"""The single-turn RLLA task as an environment, so one multi-turn trainer runs it beside the rest.

The tools are described in the task's own system prompt and never executed: the RLLA reward
compares the calls the model wrote with the ground truth. The episode ends after one turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import register_env
from toolgrpo.rewards.scoring import is_finite, score
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.tools.types import ToolCall, ToolResult


class RllaEnv(Env):
    single_turn = True  # no tool runs, so no rollback and no negatives
    reward_range = None  # format + correctness (+ length): the bounds move with flags and step

    def __init__(self, task: Task, flags: RllaFlags | None = None) -> None:
        self.task = task
        self.flags = flags
        self.max_turns = 1

    async def reset(self) -> EnvStart:
        return EnvStart([dict(m) for m in self.task.messages], [])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        raise RuntimeError("the RLLA environment is single-turn: no tool is ever executed")

    async def reward(self, transcript: Transcript) -> EnvReward:
        s = score(self.task, transcript.text, transcript.step, self.flags)
        if not is_finite(s):
            return EnvReward(float("nan"), {"nonfinite": 1.0})
        parts = {
            "format": s.format,
            "correctness": s.correctness,
            "length": s.length,
            "format_ok": float(s.format_ok),
        }
        if s.exact_call is not None:
            parts["exact_call"] = float(s.exact_call)
        return EnvReward(s.total, parts)


@register_env("rlla")
def make_rlla_env(task: Task, options: Mapping[str, Any]) -> RllaEnv:
    flags = options.get("flags")
    if isinstance(flags, Mapping):
        flags = RllaFlags(**flags)
    return RllaEnv(task, flags)

"""Calls to generated functions (``schemas:train`` / ``schemas:test``) as a one-turn environment.

The model sees the offered functions (``tools=`` for task type ``schemas``, RLLA's tool list for
``schemas_rlla``) and a request; nothing runs: its answer's calls are parsed and matched with the
expected call set (``rewards.call_match``). Score 1 for the exact call set, else 0.25 for
well-formed calls plus 0.25 for the right function names, so a group that learns the format
before the arguments still has signal. Parts: ``format_valid``, ``names_ok``, ``correct``, and
``format_valid/<call type>`` and ``correct/<call type>`` (simple, multiple, parallel,
parallel_multiple), which summaries average over that type's episodes only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import register_env
from toolgrpo.rewards.call_match import CallScore, score_calls
from toolgrpo.tools.parser import parse_tool_calls
from toolgrpo.tools.types import ToolCall, ToolResult

PARTIAL = 0.25  # each of: well-formed calls, the right names (never a full mark without both)


def answer_score(text: str, ground_truth: str) -> CallScore:
    """The verdict on one answer ``text`` for a task's ground truth (its calls and schemas)."""
    truth = json.loads(ground_truth)
    calls = parse_tool_calls(text)
    ok = all(c.parse_error is None and c.name for c in calls)
    got = [{"name": c.name, "arguments": c.arguments} for c in calls] if ok else None
    return score_calls(got, truth["calls"], truth["functions"])


class SchemaCallEnv(Env):
    single_turn = True  # the calls are judged, never run
    reward_range = (0.0, 1.0)

    def __init__(self, task: Task) -> None:
        self.task = task
        self.max_turns = 1

    async def reset(self) -> EnvStart:
        return EnvStart([dict(m) for m in self.task.messages], [dict(t) for t in self.task.tools])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        raise RuntimeError("the schemas environment is single-turn: no call is ever run")

    async def reward(self, transcript: Transcript) -> EnvReward:
        answers = [m for m in transcript.messages if m.get("role") == "assistant"]
        text = str(answers[-1].get("content") or "") if answers else ""
        s = answer_score(text, self.task.ground_truth)
        kind = self.task.meta.get("call_type", "unknown")
        parts = {
            "format_valid": float(s.format_valid),
            "names_ok": float(s.names_ok),
            "correct": float(s.correct),
            f"format_valid/{kind}": float(s.format_valid),
            f"correct/{kind}": float(s.correct),
        }
        score = 1.0 if s.correct else PARTIAL * (s.format_valid + s.names_ok)
        return EnvReward(score, parts)


def _make(task: Task, options: Mapping[str, Any]) -> SchemaCallEnv:
    if options:
        raise ValueError(f"the schemas environment takes no options, got {sorted(options)}")
    return SchemaCallEnv(task)


register_env("schemas")(_make)
register_env("schemas_rlla")(_make)

"""A generic environment from Python pieces: opening messages, a list of tools, a reward function.

Enough for most tool-use tasks without writing an ``Env`` subclass; the reward function sees the
finished ``Transcript`` and may be sync or async and return a float or an ``EnvReward``; a sync
one runs in a thread (``base.off_loop``), so one that hangs cannot block the other episodes.
"""

from __future__ import annotations

import copy
import logging
import numbers
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript, off_loop
from toolgrpo.tools.executor import run_tool_calls
from toolgrpo.tools.isolated import DEFAULT_MEMORY_LIMIT_MB
from toolgrpo.tools.schema import Tool
from toolgrpo.tools.shared_pool import modules_of, shared_pool
from toolgrpo.tools.types import ToolCall, ToolResult

log = logging.getLogger(__name__)

RewardValue = EnvReward | float
RewardFn = Callable[[Transcript], RewardValue | Awaitable[RewardValue]]


class RewardFunctionError(RuntimeError):
    """A ``reward_fn`` raised or returned something that is not a score: the environment's bug."""


class ToolEnv(Env):
    """One episode: ``reset`` opens with ``messages`` and the tools' specs, ``step`` runs the
    turn's calls in parallel, ``reward`` asks ``reward_fn``. A failing reward function raises
    ``RewardFunctionError``: the episode loop ends that episode as an environment failure (never
    scored as the model's, left out of training), and the run goes on.
    ``timeout_s`` bounds each call; ``memory_limit_mb`` what an isolated tool's call may add to
    its worker process's memory (``Tool.isolated``)."""

    def __init__(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Tool],
        reward_fn: RewardFn,
        max_turns: int = 4,
        timeout_s: float | None = 10.0,
        max_parallel: int | None = None,
        memory_limit_mb: float | None = DEFAULT_MEMORY_LIMIT_MB,
        stateless: bool = False,
        reward_range: tuple[float, float] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        by_name: dict[str, Tool] = {}
        for t in tools:
            if t.name in by_name:
                raise ValueError(f"duplicate tool name {t.name!r}")
            by_name[t.name] = t
        self.messages = [dict(m) for m in messages]
        self.tools = by_name
        self.reward_fn = reward_fn
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.max_parallel = max_parallel
        self.memory_limit_mb = memory_limit_mb
        isolated = [t for t in by_name.values() if t.isolated]
        if isolated:  # start the worker pool's zygote while the episode generates its first turn
            shared_pool(modules_of(isolated[0].fn)).warm()
        # Tools that keep no state (pure functions, read-only lookups) make a snapshot free,
        # which is all tool rollback needs; tools with side effects need an Env of their own.
        self.supports_snapshot = stateless
        # What reward_fn can return (a failing reward_fn scores 0: include 0); None = unknown.
        self.reward_range = reward_range

    async def reset(self) -> EnvStart:
        # A deep copy: the episode loop appends to and may edit its messages.
        return EnvStart(copy.deepcopy(self.messages), [t.spec() for t in self.tools.values()])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return await run_tool_calls(
            self.tools, calls, self.timeout_s, self.max_parallel, self.memory_limit_mb
        )

    def snapshot(self) -> None:
        if not self.supports_snapshot:
            return super().snapshot()
        return None

    def restore(self, state: Any) -> None:
        if not self.supports_snapshot:
            super().restore(state)

    async def reward(self, transcript: Transcript) -> EnvReward:
        try:
            return _as_reward(await off_loop(self.reward_fn, transcript))
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function failed: {type(exc).__name__}: {exc}"
            ) from exc


def _as_reward(value: Any) -> EnvReward:
    if isinstance(value, EnvReward):
        return value
    if isinstance(value, numbers.Real):  # float, int, numpy scalars
        return EnvReward(float(value))
    raise TypeError(f"reward_fn must return a float or EnvReward, got {type(value).__name__}")

"""Deadlines on environment calls (``rollout.env_calls``): an environment that never answers
ends its own episode as an environment failure, within the deadline, and the other episodes of
the step finish as usual. Before, one hung ``step`` (awaiting forever, or a sync simulator
blocking in ``time.sleep``) held the whole step forever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest

from tests.rollout.test_multi_turn import (
    CALL,
    TASK,
    AddEnv,
    ScriptedGenerator,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.env_calls import EnvClock, EnvDeadline
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task, play_tasks
from toolgrpo.tools.types import ToolCall, ToolResult

ANSWER = "<answer>5</answer>"
DEADLINE = 0.5
LIMITS = EpisodeLimits(max_response_length=400, env_call_timeout_s=DEADLINE)
# Fails the test instead of hanging it on code without deadlines.
OUTER_S = 20.0


class AwaitsForever(AddEnv):
    async def step(self, calls):
        await asyncio.Event().wait()  # nobody ever sets it


class SleepsInThread(AddEnv):
    """A sync ``step``, as a simulator written as plain Python is: it blocks its thread."""

    def step(self, calls):  # type: ignore[override]
        time.sleep(3)
        return [ToolResult("RESULT=5", name=c.name, call_id=c.id) for c in calls]


class SyncAdd(AddEnv):
    def step(self, calls):  # type: ignore[override]
        return [ToolResult("RESULT=5", name=c.name, call_id=c.id) for c in calls]


class HangsIn(AddEnv):
    """Hangs in one method (``where``): awaiting forever, or (``sync_reward``) a sync reward
    function blocking its thread."""

    def __init__(self, where: str) -> None:
        super().__init__(follow_up=True)
        self.where = where

    async def reset(self):
        if self.where == "reset":
            await asyncio.sleep(3600)
        return await super().reset()

    async def next_user_turn(self, messages):
        if self.where == "next_user_turn":
            await asyncio.sleep(3600)
        return await super().next_user_turn(messages)

    async def reward(self, transcript):
        if self.where == "reward":
            await asyncio.sleep(3600)
        return await super().reward(transcript)

    async def close(self):
        if self.where == "close":
            await asyncio.sleep(3600)


_HANGING = {"await": AwaitsForever, "sleep": SleepsInThread}


@register_env("test_hangs")
def _hangs(task: Task, options: Mapping[str, Any]) -> AddEnv:
    return _HANGING[options["how"]]() if task.task_id == "hang" else AddEnv()


def _play_tasks(tok, how: str, limits: EpisodeLimits = LIMITS):  # noqa: F811
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_hangs", "max_turns": 4, "how": how}})
    tasks = [TASK, Task("hang", TASK.messages, "5", "test", "add")]

    async def bounded():
        return await asyncio.wait_for(play_tasks(tasks, 2, router, batcher, tok, limits), OUTER_S)

    t0 = time.monotonic()
    try:
        return asyncio.run(bounded()), time.monotonic() - t0
    finally:
        batcher.close()


@pytest.mark.parametrize("how", ["await", "sleep"])
def test_a_hung_step_fails_its_episodes_and_the_rest_of_the_batch_finishes(tok, how):  # noqa: F811
    eps, took = _play_tasks(tok, how)
    assert took < 2.5, took  # the deadline, not the hang (or the 3 s sleep), decides
    ok, hung = eps[:2], eps[2:]
    assert all(e.env_failure is None and e.reward == 1.0 and e.num_turns == 2 for e in ok)
    for e in hung:
        assert e.stop_reason == "env_error"
        assert e.env_failure == (
            "step did not return within 0.5s "
            "(actor_rollout_ref.rollout.multi_turn.env_call_timeout_s)"
        )
        assert e.num_turns == 1 and e.tool_calls == 0  # the partial episode is kept, unscored


def test_a_sync_step_runs_off_the_event_loop(tok):  # noqa: F811
    """A plain ``def step`` is a valid environment: it runs in a thread and its results count."""
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, SyncAdd(), batcher, tok, LIMITS, uid="u"))
    batcher.close()
    assert ep.env_failure is None and ep.reward == 1.0 and ep.tool_calls == 1


@pytest.mark.parametrize("where", ["reset", "next_user_turn", "reward"])
def test_every_environment_call_has_a_deadline(tok, where):  # noqa: F811
    gen = ScriptedGenerator(tok, [ANSWER, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    play = play_task(TASK, HangsIn(where), batcher, tok, LIMITS, uid="u")
    t0 = time.monotonic()
    ep = asyncio.run(asyncio.wait_for(play, OUTER_S))
    batcher.close()
    assert time.monotonic() - t0 < 2.5
    assert ep.stop_reason == "env_error"
    assert ep.env_failure is not None and ep.env_failure.startswith(f"{where} did not return")


def test_a_sync_reward_function_that_blocks_is_abandoned(tok):  # noqa: F811
    """``ToolEnv`` runs a sync reward function in a thread, so the deadline can leave it."""

    def reward_fn(transcript):
        time.sleep(3)
        return 1.0

    env = ToolEnv([{"role": "user", "content": "hi"}], [], reward_fn, max_turns=2)
    gen = ScriptedGenerator(tok, [ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    t0 = time.monotonic()
    ep = asyncio.run(asyncio.wait_for(play_task(TASK, env, batcher, tok, LIMITS), OUTER_S))
    batcher.close()
    assert time.monotonic() - t0 < 2.5
    assert ep.env_failure is not None and ep.env_failure.startswith("reward did not return")


@register_env("test_close_hangs")
def _close_hangs(task: Task, options: Mapping[str, Any]) -> AddEnv:
    return HangsIn("close")


def test_a_hung_close_does_not_hold_the_step(tok):  # noqa: F811
    """Closing is best effort: a close that never returns is left at the call deadline."""
    gen = ScriptedGenerator(tok, [ANSWER, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_close_hangs", "max_turns": 4}})
    play = play_tasks([TASK], 2, router, batcher, tok, LIMITS)
    t0 = time.monotonic()
    eps = asyncio.run(asyncio.wait_for(play, OUTER_S))
    batcher.close()
    assert time.monotonic() - t0 < 2.5
    assert all(e.env_failure is None and e.reward == 1.0 for e in eps)


class SlowSteps(AddEnv):
    async def step(self, calls):
        await asyncio.sleep(0.3)
        return await super().step(calls)


def test_the_episode_budget_bounds_the_sum_of_calls(tok):  # noqa: F811
    """Each step (0.3 s) is within its 5 s deadline, but the episode's environment time
    (1.05 s) runs out on the fourth; generation time does not count."""
    limits = EpisodeLimits(
        max_response_length=2000, env_call_timeout_s=5.0, env_episode_timeout_s=1.05
    )
    gen = ScriptedGenerator(tok, [CALL] * 8)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, SlowSteps(max_turns=8), batcher, tok, limits, uid="u"))
    batcher.close()
    assert ep.stop_reason == "env_error" and ep.num_turns == 4
    assert ep.env_failure == (
        "step did not return before the episode's 1.05s of environment time ran out "
        "(actor_rollout_ref.rollout.multi_turn.env_episode_timeout_s)"
    )


def test_the_clock_passes_results_and_errors_through():
    async def run():
        clock = EnvClock(1.0, 0)
        assert await clock.call("a", lambda x: x + 1, 1) == 2  # sync: in a thread

        async def boom():
            raise KeyError("k")

        with pytest.raises(KeyError):
            await clock.call("b", boom)
        with pytest.raises(EnvDeadline, match="c did not return within 0.05s"):
            await EnvClock(0.05, None).call("c", asyncio.sleep, 10)
        return clock.spent_s

    assert asyncio.run(run()) < 1.0


class Stubborn(AddEnv):
    """Swallows its cancellation and keeps waiting: ``asyncio.wait_for`` would wait for it."""

    async def step(self, calls):
        for _ in range(3):
            try:
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                continue
        return [ToolResult("late", name=c.name, call_id=c.id) for c in calls]


def test_a_call_that_ignores_cancellation_is_left_behind(tok):  # noqa: F811
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_response_length=400, env_call_timeout_s=0.2)

    async def run():
        t0 = time.monotonic()
        ep = await play_task(TASK, Stubborn(), batcher, tok, limits, uid="u")
        return ep, time.monotonic() - t0

    ep, took = asyncio.run(run())  # asyncio.run itself then waits out the stubborn call
    batcher.close()
    assert ep.env_failure is not None and ep.env_failure.startswith("step did not return")
    assert took < 1.0


def test_the_call_timeout_rule_covers_every_environment_type(tok):  # noqa: F811
    """The one timeout rule: a ``timeout`` result is the environment's failure, whichever
    environment reports it (here one that returns it, as a remote server or BFCL would)."""

    class ReportsTimeout(AddEnv):
        async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
            return [
                ToolResult("Error: tool 'add' timed out after 10s", True, "timeout", c.name, c.id)
                for c in calls
            ]

        async def reward(self, transcript):
            return EnvReward(0.0)

    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, ReportsTimeout(), batcher, tok, LIMITS, uid="u"))
    batcher.close()
    assert ep.stop_reason == "env_error" and ep.tool_error_types == {"timeout": 1}
    assert ep.env_failure == "tool call timed out (tool 'add' timed out after 10s)"


def test_a_timeout_error_the_environment_raises_is_not_our_deadline(tok):  # noqa: F811
    class RaisesTimeout(AddEnv):
        async def step(self, calls):
            raise TimeoutError("my own client gave up")

    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, RaisesTimeout(), batcher, tok, LIMITS, uid="u"))
    batcher.close()
    assert ep.env_failure == "step raised TimeoutError: my own client gave up"


class SlowCalls(AddEnv):
    """Each call well within the 0.5 s deadline, an episode's calls together well past it."""

    async def reset(self):
        await asyncio.sleep(0.2)
        return await super().reset()

    async def step(self, calls):
        await asyncio.sleep(0.2)
        return await super().step(calls)

    async def reward(self, transcript):
        await asyncio.sleep(0.2)
        return await super().reward(transcript)


register_env("test_slow_calls")(lambda task, options: SlowCalls())


def test_waiting_for_a_max_concurrency_slot_is_not_the_resets_time(tok):  # noqa: F811
    """One slot, two episodes: the second waits for the whole first episode (reset, two steps
    and reward: 0.8 s of calls), longer than the 0.5 s call deadline, and still plays:
    its reset's deadline starts when the slot is held. Before, the wait was the reset's, and the
    second episode failed with ``reset did not return within 0.5s``."""
    gen = ScriptedGenerator(tok, [CALL, CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_slow_calls", "max_concurrency": 1}})
    try:
        eps = asyncio.run(
            asyncio.wait_for(play_tasks([TASK], 2, router, batcher, tok, LIMITS), OUTER_S)
        )
    finally:
        batcher.close()
    assert [e.env_failure for e in eps] == [None, None]
    assert all(e.reward == 1.0 and e.num_turns == 3 for e in eps)
    waits = sorted(e.meta["env_slot_wait_s"] for e in eps)
    assert waits[0] < 0.2 and waits[1] > DEADLINE, waits  # the second did queue past it


def test_a_slot_wait_past_the_episode_budget_is_an_environment_failure(tok):  # noqa: F811
    """While another environment holds the only slot, an episode waits until its budget of
    environment time runs out, and fails saying it waited for a slot (not that reset timed out);
    the slots all come back afterwards."""
    gen = ScriptedGenerator(tok, [ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_hangs", "how": "await", "max_concurrency": 1}})
    limits = EpisodeLimits(
        max_response_length=400, env_call_timeout_s=5.0, env_episode_timeout_s=0.3
    )

    async def run():
        squatter = router.make(TASK)
        await squatter.reset()  # holds the only slot
        t0 = time.monotonic()
        (failed,) = await play_tasks([TASK], 1, router, batcher, tok, limits)
        took = time.monotonic() - t0
        await squatter.close()
        after = await play_tasks([TASK], 2, router, batcher, tok, limits)  # a slot is free again
        return failed, took, after

    try:
        failed, took, after = asyncio.run(asyncio.wait_for(run(), OUTER_S))
    finally:
        batcher.close()
    assert failed.stop_reason == "env_error" and failed.reward == limits.error_reward
    assert failed.env_failure == (
        "waited for a max_concurrency slot of task type 'add' until the episode's 0.3s of "
        "environment time ran out (actor_rollout_ref.rollout.multi_turn.env_episode_timeout_s)"
    )
    assert 0.25 < failed.meta["env_slot_wait_s"] and took < 2.0
    assert [e.env_failure for e in after] == [None, None]

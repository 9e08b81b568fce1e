"""Deadlines where environments are built and probed: the episode's construction, the startup
checks (rollback's, the prompt-length measurement, the router's tool listing) and an ``async``
method that blocks the event loop. Each used to run unbounded (and the rollback checks never
closed their environments)."""

from __future__ import annotations

import asyncio
import logging
import time
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
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.rollout import env_calls, prompts, rollback_checks
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task, play_tasks
from toolgrpo.rollout.rollback import check_negative_reward, check_snapshot_support
from toolgrpo.router import catalog

DEADLINE = 0.5
LIMITS = EpisodeLimits(max_response_length=400, env_call_timeout_s=DEADLINE)
OUTER_S = 20.0  # fails the test instead of hanging it on code without deadlines
ANSWER = "<answer>5</answer>"


class Counted(AddEnv):
    """Counts how many instances were built and closed (per test: ``reset_counts``)."""

    built = 0
    closed = 0
    supports_snapshot = True
    reward_range = (0.0, 1.0)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        type(self).built += 1

    async def close(self) -> None:
        type(self).closed += 1

    def snapshot(self) -> None:
        return None

    def restore(self, state: Any) -> None:
        pass


class SlowToBuild(Counted):
    """A constructor that blocks (a server that never answers its handshake) for task ``slow``."""

    def __init__(self, task: Task, **kw: Any) -> None:
        if task.task_id == "slow":
            time.sleep(2.0)
        super().__init__(**kw)


class HangingReset(Counted):
    async def reset(self):
        await asyncio.sleep(3600)


class BlocksTheLoop(Counted):
    """``async def step`` that blocks the event loop (``time.sleep``) for ``block_s``."""

    def __init__(self, block_s: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.block_s = block_s

    async def step(self, calls):
        time.sleep(self.block_s)
        return await super().step(calls)


register_env("test_slow_build")(lambda task, options: SlowToBuild(task, **options))
register_env("test_hanging_reset")(lambda task, options: HangingReset(**options))


@pytest.fixture(autouse=True)
def reset_counts():
    for cls in (Counted, SlowToBuild, HangingReset, BlocksTheLoop):
        cls.built = cls.closed = 0


def _play_all(tok, tasks, router):  # noqa: F811
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    run = play_tasks(tasks, 2, router, batcher, tok, LIMITS)
    try:
        return asyncio.run(asyncio.wait_for(run, OUTER_S))
    finally:
        batcher.close()


def test_a_constructor_that_hangs_fails_its_episodes_within_the_deadline(tok):  # noqa: F811
    router = EnvRouter({"add": {"type": "test_slow_build", "max_turns": 4}})
    tasks = [Task("slow", TASK.messages, "5", "test", "add"), TASK]
    t0 = time.perf_counter()
    eps = _play_all(tok, tasks, router)
    assert time.perf_counter() - t0 < 1.8  # not held by the 2 s constructor
    slow, ok = eps[:2], eps[2:]
    for e in slow:
        assert e.env_failure and "construction did not return within 0.5s" in e.env_failure
    assert all(e.env_failure is None and e.reward == 1.0 for e in ok)
    time.sleep(2.0)  # the late constructors return in their threads ...
    assert SlowToBuild.built == 4 and SlowToBuild.closed == 4  # ... and close what they built


def test_an_async_method_that_blocks_the_loop_is_an_environment_failure(tok):  # noqa: F811
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    run = play_task(TASK, BlocksTheLoop(2.0), batcher, tok, LIMITS, uid="u")
    ep = asyncio.run(asyncio.wait_for(run, OUTER_S))
    batcher.close()
    assert ep.stop_reason == "env_error" and ep.env_failure is not None
    assert "step blocked the event loop for 2.0s, past its 0.5s deadline" in ep.env_failure


def test_a_short_stall_is_logged_not_failed(tok, caplog, monkeypatch):  # noqa: F811
    monkeypatch.setattr(env_calls, "STALL_WARN_S", 0.1)
    monkeypatch.setattr(env_calls, "_WARNED", set())
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    with caplog.at_level(logging.WARNING):
        ep = asyncio.run(play_task(TASK, BlocksTheLoop(0.25), batcher, tok, LIMITS, uid="u"))
    batcher.close()
    assert ep.env_failure is None and ep.reward == 1.0
    assert "environment step blocked the event loop for 0." in caplog.text


def test_the_rollback_startup_checks_close_their_environments_and_have_deadlines(monkeypatch):
    router = EnvRouter({"add": {"type": "test_slow_build"}})
    check_snapshot_support(router, [TASK])
    check_negative_reward(router, [TASK], -1.0)
    assert SlowToBuild.built == 2 and SlowToBuild.closed == 2
    monkeypatch.setattr(rollback_checks, "TIMEOUT_S", DEADLINE)
    slow = Task("slow", TASK.messages, "5", "test", "add")
    t0 = time.perf_counter()
    check_snapshot_support(router, [slow])  # a type that does not build in time is skipped
    check_negative_reward(router, [slow], 5.0)
    assert time.perf_counter() - t0 < 1.8
    time.sleep(2.5)  # the late constructors return, and their environments are closed
    assert SlowToBuild.built == SlowToBuild.closed == 4


def test_the_prompt_length_measurement_bounds_construction(tok, monkeypatch):  # noqa: F811
    monkeypatch.setattr(prompts, "_MEASURE_TIMEOUT_S", DEADLINE)
    router = EnvRouter({"add": {"type": "test_slow_build"}})
    tasks = [Task("slow", TASK.messages, "5", "test", "add")]
    t0 = time.perf_counter()
    kept = prompts.filter_overlong(tok, tasks, 10_000, router)
    assert kept == tasks and time.perf_counter() - t0 < 1.8  # kept, unmeasured
    assert prompts.filter_overlong(tok, [TASK], 10_000, router) == [TASK]
    time.sleep(2.0)  # the late constructor returns; its environment is closed in its thread
    assert SlowToBuild.built == SlowToBuild.closed == 2


def test_the_routers_tool_listing_bounds_the_reset_and_closes_the_env(monkeypatch, caplog):
    monkeypatch.setattr(catalog, "RESET_TIMEOUT_S", DEADLINE)
    router = EnvRouter({"add": {"type": "test_hanging_reset"}})
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        assert catalog.env_tools([TASK], router) == []
    assert time.perf_counter() - t0 < 1.8
    assert HangingReset.built == 1 and HangingReset.closed == 1
    assert "could not list the tools of add" in caplog.text

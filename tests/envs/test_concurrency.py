"""``envs.<task type>.max_concurrency``: at most that many environments of the type open at once
(a reset waits for a slot, a close frees it, also after a failure); bad values are refused at
startup. Before, the key was passed to the environment's factory as an unknown option."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart
from toolgrpo.envs.concurrency import slot_taker
from toolgrpo.envs.registry import EnvConfigError, EnvRouter, register_env
from toolgrpo.tools.types import ToolResult

TASK = Task("c1", ({"role": "user", "content": "hi"},), "", "test", "capped")


class CountingEnv(Env):
    open_now = 0
    most = 0
    fail_reset = False

    def __init__(self, task, options) -> None:
        self.task = task

    async def reset(self) -> EnvStart:
        CountingEnv.open_now += 1
        CountingEnv.most = max(CountingEnv.most, CountingEnv.open_now)
        await asyncio.sleep(0.01)
        if CountingEnv.fail_reset:
            raise RuntimeError("down")
        return EnvStart([dict(m) for m in self.task.messages])

    async def step(self, calls):
        return [ToolResult("ok", name=c.name, call_id=c.id) for c in calls]

    async def reward(self, transcript) -> EnvReward:
        return EnvReward(0.0)

    async def close(self) -> None:
        CountingEnv.open_now -= 1


register_env("counting")(CountingEnv)


def episodes(router: EnvRouter, n: int) -> None:
    async def one() -> None:
        env = router.make(TASK)
        try:
            await env.reset()
            await asyncio.sleep(0.02)
        except RuntimeError:
            pass
        finally:
            await env.close()

    async def all_of_them() -> None:
        await asyncio.gather(*(one() for _ in range(n)))

    asyncio.run(all_of_them())


def test_at_most_max_concurrency_environments_are_open_at_once():
    CountingEnv.most, CountingEnv.fail_reset = 0, False
    router = EnvRouter({"capped": {"type": "counting", "max_concurrency": 2}})
    episodes(router, 8)
    assert CountingEnv.most == 2
    episodes(router, 8)  # a new event loop (the next step): the slots were all given back
    assert CountingEnv.most == 2 and CountingEnv.open_now == 0
    CountingEnv.most = 0
    episodes(EnvRouter({"capped": {"type": "counting"}}), 8)  # no cap: all at once
    assert CountingEnv.most == 8


def test_a_failed_reset_gives_its_slot_back():
    CountingEnv.most, CountingEnv.fail_reset = 0, True
    router = EnvRouter({"capped": {"type": "counting", "max_concurrency": 1}})
    try:
        episodes(router, 4)  # would wait forever if a failed episode kept its slot
    finally:
        CountingEnv.fail_reset = False
    assert CountingEnv.most == 1
    assert pickle.loads(pickle.dumps(router)).specs["capped"].max_concurrency == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4", True])
def test_bad_max_concurrency_is_refused(bad):
    with pytest.raises(EnvConfigError, match="max_concurrency"):
        EnvRouter({"capped": {"type": "counting", "max_concurrency": bad}})
    assert EnvRouter({"capped": {"type": "counting", "max_concurrency": None}})


def test_a_slot_wait_cancelled_or_timed_out_holds_no_slot():
    """The episode loop waits for a slot before the reset (``slot_taker``): a wait cancelled
    (the episode was) or timed out (its budget ran out) takes no slot, and closing such an
    environment gives none back that it never had (the cap would grow)."""
    router = EnvRouter({"capped": {"type": "counting", "max_concurrency": 1}})
    assert slot_taker(EnvRouter({"capped": {"type": "counting"}}).make(TASK)) is None  # no cap

    async def run() -> None:
        holder, cancelled, late = (router.make(TASK) for _ in range(3))
        await holder.reset()  # holds the only slot
        waiting = asyncio.ensure_future(slot_taker(cancelled)())
        await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slot_taker(late)(), 0.05)
        for env in (holder, cancelled, late):
            await env.close()
        first, second = router.make(TASK), router.make(TASK)
        await asyncio.wait_for(slot_taker(first)(), 1.0)  # the slot is free again
        await first.reset()  # already holds it: takes no second one
        with pytest.raises(TimeoutError):  # and there is still only one
            await asyncio.wait_for(slot_taker(second)(), 0.05)
        await first.close()
        await second.close()

    open_now = CountingEnv.open_now
    try:
        asyncio.run(run())
    finally:
        CountingEnv.open_now = open_now

"""Pooled MCP stdio servers: a server that offers ``reset`` serves episode after episode (reset
between them), one that failed, died or cannot be reset is never handed on, and closing the
pools stops them. Before, every episode started (and stopped) a server of its own."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

pytest.importorskip("mcp")

from tests.envs.test_mcp import SERVER, TASK, router  # noqa: E402
from toolgrpo.envs.pool import close_env_pools, on_pool_loop  # noqa: E402
from toolgrpo.envs.registry import EnvConfigError  # noqa: E402
from toolgrpo.tools.types import ToolCall  # noqa: E402


def server(**opts):
    """The test server over stdio; a generous start timeout (the machine may be busy)."""
    return router(command=[sys.executable, SERVER], connect_timeout_s=120, **opts)


@pytest.fixture(autouse=True)
def _fresh_pools():
    close_env_pools()
    yield
    close_env_pools()


def episode(r, calls=(("bump", {}),)):
    """One episode under its own event loop (as the trainer plays each step): the server's
    pid, the tool names the model saw, the results' texts and the environment's failure."""

    async def play():
        env = r.make(TASK)
        start = await env.reset()
        try:
            pid = await env.step([ToolCall("pid", {}, id="p")])
            res = await env.step([ToolCall(n, a, id=f"c{i}") for i, (n, a) in enumerate(calls)])
        finally:
            await env.close()
        names = {t["function"]["name"] for t in start.tools}
        return int(pid[0].text), names, [x.text for x in res], env.fatal_error

    return asyncio.run(play())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_resettable_server_is_reused_and_reset_between_episodes():
    r = server()
    pid1, names, texts1, err1 = episode(r, [("bump", {}), ("bump", {})])
    pid2, _, texts2, err2 = episode(r)
    assert pid1 == pid2 and err1 is None and err2 is None  # the same process served both
    assert texts1 == ["1", "2"] and texts2 == ["1"]  # the second episode began reset
    assert "reset" not in names and {"add", "bump", "pid"} <= names  # the pool's, not the model's
    close_env_pools()
    deadline = time.monotonic() + 10
    while alive(pid1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid1)


def test_pooling_off_or_no_reset_tool_starts_a_server_per_episode():
    for opts in ({"pool_sessions": False}, {"reset_tool": "no_such_tool"}):
        r = server(**opts)
        (pid1, names, _, _), (pid2, _, texts, _) = episode(r), episode(r)
        assert pid1 != pid2 and texts == ["1"]
        assert "reset" in names  # not the pool's: the model sees the server's tool as it is
    with pytest.raises(EnvConfigError, match="pool_sessions"):
        router(command="x", pool_sessions="yes").make(TASK)


def test_a_failed_episodes_server_is_stopped_not_reused():
    r = server(timeout_s=1)
    pid1, _, _, err = episode(r, [("slow", {"seconds": 3})])
    assert err is not None and "timed out" in err
    pid2, _, texts, err2 = episode(r)
    assert pid2 != pid1 and texts == ["1"] and err2 is None


def test_a_server_that_died_while_idle_is_replaced_without_failing_the_episode():
    r = server()
    pid1, *_ = episode(r)
    os.kill(pid1, signal.SIGKILL)
    pid2, _, texts, err = episode(r)
    assert pid2 != pid1 and texts == ["1"] and err is None


def test_concurrent_episodes_get_servers_of_their_own():
    r = server()

    async def both():
        envs = [r.make(TASK) for _ in range(2)]
        await asyncio.gather(*(e.reset() for e in envs))
        pids = [(await e.step([ToolCall("pid", {}, id="p")]))[0].text for e in envs]
        await asyncio.gather(*(e.close() for e in envs))
        return pids

    first, second = asyncio.run(both()), asyncio.run(both())
    assert len(set(first)) == 2 and set(second) == set(first)  # two servers, both reused


def test_a_server_whose_episode_stopped_waiting_serves_the_next():
    """A start cut short by its episode's deadline goes on, and its server waits idle."""
    r = server()
    pool = r.make(TASK)._pool_for()

    async def impatient():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(on_pool_loop(pool.acquire()), 0.05)

    asyncio.run(impatient())
    deadline = time.monotonic() + 120
    while not pool.idle and time.monotonic() < deadline:
        time.sleep(0.1)
    _, _, texts, err = episode(r)
    assert pool.started == 1 and texts == ["1"] and err is None

"""The ``openenv`` environment type (issue #20 item 5) against an OpenEnv server the test starts
on 127.0.0.1 (``openenv-core``; skipped without the extra). New: main has no such type."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.mcp_client")

from toolgrpo.data.task import Task  # noqa: E402
from toolgrpo.envs.base import Transcript  # noqa: E402
from toolgrpo.envs.registry import EnvConfigError, EnvRouter  # noqa: E402
from toolgrpo.rollout.rollback import SnapshotUnsupported, check_snapshot_support  # noqa: E402
from toolgrpo.tools.types import ToolCall  # noqa: E402

SERVER = str(Path(__file__).with_name("openenv_server.py"))
TASK = Task("o1", ({"role": "user", "content": "2+3?"},), "5", "test", "adder")


def router(**opts) -> EnvRouter:
    return EnvRouter({"adder": {"type": "openenv", "max_turns": 4, **opts}})


@pytest.fixture(scope="module")
def server_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, str(port)])
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, "the OpenEnv test server exited"
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def play(env, turns):
    start = await env.reset()
    try:
        results = [await env.step(calls) for calls in turns]
        reward = await env.reward(Transcript(start.messages, "", "done", len(turns)))
        return start, results, reward
    finally:
        await env.close()


def test_reset_lists_tools_and_steps_carry_reward_and_done(server_url):
    env = router(url=server_url).make(TASK)
    turns = [
        [ToolCall("add", {"a": 2, "b": 3}, id="c0"), ToolCall("nope", {}, id="c1")],
        [ToolCall("submit", {"answer": 5}, id="c2"), ToolCall("add", {"a": 1, "b": 1}, id="c3")],
    ]
    start, (first, second), reward = asyncio.run(play(env, turns))
    assert {t["function"]["name"] for t in start.tools} == {"add", "submit"}
    add, unknown = first
    assert add.text == "5" and not add.is_error
    assert unknown.error_type == "unknown_tool"
    assert len(second) == 1 and second[0].done  # done ends the turn: no call after it runs
    assert reward.score == 1.0 and env.fatal_error is None


def test_unreachable_server_is_the_environments_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    env = router(url=f"http://127.0.0.1:{port}", connect_timeout_s=3).make(TASK)
    start, (res,), _ = asyncio.run(play(env, [[ToolCall("add", {"a": 1, "b": 1}, id="c0")]]))
    assert env.fatal_error is not None and res[0].error_type == "transport"
    assert start.messages[-1]["content"] == "2+3?"


def test_bad_config_and_rollback_refused():
    with pytest.raises(EnvConfigError, match="url"):
        router(url="ftp://x").make(TASK)
    with pytest.raises(EnvConfigError, match="reward"):
        router(url="http://127.0.0.1:1", reward="magic").make(TASK)
    with pytest.raises(SnapshotUnsupported):
        check_snapshot_support(router(url="http://127.0.0.1:1"), [TASK])


def _start(*args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, str(port), *args], stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        assert proc.poll() is None, "the OpenEnv test server exited"
        time.sleep(0.3)
    raise AssertionError("the OpenEnv test server did not start")


def test_a_full_server_is_waited_for_not_failed(server_url):
    """OpenEnv's default session limit is 1: concurrent episodes used to fail with
    CAPACITY_REACHED (3 of 4); now each waits for the session before it and all score."""

    async def many(n, **opts):
        async def one():
            env = router(url=server_url, **opts).make(TASK)
            turns = [
                [ToolCall("add", {"a": 2, "b": 3}, id="a")],
                [ToolCall("submit", {"answer": 5})],
            ]
            _, _, reward = await play(env, turns)
            return env.fatal_error, reward.score

        return await asyncio.gather(*(one() for _ in range(n)))

    assert asyncio.run(many(6)) == [(None, 1.0)] * 6

    async def held_then_refused():
        holder = router(url=server_url).make(TASK)
        await holder.reset()
        try:
            env = router(url=server_url, capacity_wait_s=0.5).make(TASK)
            await env.reset()
            return env.fatal_error
        finally:
            await holder.close()

    reason = asyncio.run(held_then_refused())
    assert "session limit" in reason and "max_concurrent_envs" in reason


def test_a_text_environment_is_refused_naming_what_is_missing():
    proc, url = _start("text")
    try:
        env = router(url=url).make(TASK)
        start, _, _ = asyncio.run(play(env, []))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert start.tools == [] and env.fatal_error.startswith("openenv environment refused")
    assert "ListToolsAction" in env.fatal_error and "not MCP tool calls" in env.fatal_error
    with pytest.raises(EnvConfigError, match="capacity_wait_s"):
        router(url=url, capacity_wait_s=-1).make(TASK)


def test_one_reset_measures_every_task_of_the_type(server_url):
    """The startup length check opens one session for the task type, not one per task."""
    from toolgrpo.rollout.prompts import env_starts

    tasks = [
        Task(f"o{i}", ({"role": "user", "content": "x" * i},), "5", "test", "adder")
        for i in range(5)
    ]
    starts = env_starts(router(url=server_url), tasks)
    assert all(s is not None for s in starts)
    assert [s.messages[-1]["content"] for s in starts] == ["x" * i for i in range(5)]
    assert all({t["function"]["name"] for t in s.tools} == {"add", "submit"} for s in starts)

"""Remote environments: a real uvicorn server (thread or subprocess) and ``RemoteEnv`` against it.

The served env is defined here so these tests depend on nothing but the Env contract; the killed
server test imports this module in the server process (``serve-env --import``) to get it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.envs.server_thread import serve_in_thread
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvConfigError, EnvRouter, register_env
from toolgrpo.envs.remote import RemoteEnv, RemoteOptions
from toolgrpo.envs.server import parse_options
from toolgrpo.envs.wire import (
    call_from_dict,
    call_to_dict,
    result_from_dict,
    result_to_dict,
    task_from_dict,
    task_to_dict,
    transcript_from_dict,
    transcript_to_dict,
)
from toolgrpo.tools.types import ToolCall, ToolResult

ENV = "echo_counter_test"
ROOT = Path(__file__).resolve().parents[2]


def _spec(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@register_env(ENV)
class EchoCounterEnv(Env):
    """echo / count / sleep tools over a counter that snapshots; one extra user turn."""

    max_turns = 3
    supports_snapshot = True
    sleeping = 0  # sessions inside the sleep tool right now, and the most seen at once
    peak_sleeping = 0

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        self.task = task
        self.count = int(options.get("start", 0))
        self.users_left = 1

    async def reset(self) -> EnvStart:
        if self.task.meta.get("fail_reset"):
            raise RuntimeError("reset exploded")
        return EnvStart(list(self.task.messages), [_spec("echo"), _spec("count"), _spec("sleep")])

    async def _call(self, c: ToolCall) -> ToolResult:
        if c.parse_error:
            return ToolResult(f"bad call: {c.parse_error}", True, "parse", c.name, c.id)
        if c.name == "echo":
            text = json.dumps(c.arguments, sort_keys=True)
            return ToolResult(text, name="echo", call_id=c.id, metrics={"chars": float(len(text))})
        if c.name == "explode":  # an environment bug, not a tool error
            raise RuntimeError("step exploded")
        if c.name == "count":
            self.count += int(c.arguments.get("by", 1))
            return ToolResult(str(self.count), name="count", call_id=c.id)
        if c.name == "sleep":
            cls = type(self)
            cls.sleeping += 1
            cls.peak_sleeping = max(cls.peak_sleeping, cls.sleeping)
            try:
                await asyncio.sleep(float(c.arguments.get("s", 0)))
            finally:
                cls.sleeping -= 1
            return ToolResult("slept", name="sleep", call_id=c.id)
        return ToolResult(f"no tool {c.name}", True, "unknown_tool", c.name, c.id)

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self._call(c) for c in calls)))

    async def next_user_turn(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        if not self.users_left:
            return None
        self.users_left -= 1
        return [{"role": "user", "content": f"again, after {len(messages)} messages"}]

    async def reward(self, t: Transcript) -> EnvReward:
        hit = float(self.task.ground_truth in t.text)
        return EnvReward(
            self.count + hit, {"count": float(self.count), "turns": float(t.num_turns)}
        )

    def snapshot(self) -> int:
        return self.count

    def restore(self, state: int) -> None:
        self.count = state


def make_task(i: int = 0, **meta: Any) -> Task:
    msgs = ({"role": "system", "content": "use tools"}, {"role": "user", "content": f"task {i}"})
    return Task(f"t{i}", msgs, f"answer-{i}", task_type="remote_echo", meta=dict(meta))


def remote(url: str, task: Task | None = None, **opts: Any) -> RemoteEnv:
    return RemoteEnv(task or make_task(), RemoteOptions.parse({"url": url, **opts}))


CALLS = [
    ToolCall("echo", {"x": 1, "s": "hi"}, raw='{"name": "echo"}', id="call_0"),
    ToolCall("count", {"by": 2}, id="call_1"),
    ToolCall("count", {}, id="call_2"),
    ToolCall("nope", {}, id="call_3"),
    ToolCall("", raw="{oops", parse_error="not JSON", id="call_4"),
]


async def run_episode(env: Env) -> tuple[Any, ...]:
    """reset, one turn of parallel calls, the extra user turn, then the reward."""
    start = await env.reset()
    results = await env.step(CALLS)
    msgs = [*start.messages, {"role": "assistant", "content": "calling"}]
    msgs += [r.to_message() for r in results]
    user = await env.next_user_turn(msgs)
    after = await env.next_user_turn([*msgs, *(user or [])])
    text = f"... final: answer-0 ({len(msgs)} messages)"
    reward = await env.reward(Transcript(msgs, text, "answer", 2, step=7))
    await env.close()
    return start, results, user, after, reward


@contextmanager
def thread_server(token: str | None = None, **options: Any) -> Iterator[str]:
    """The echo-counter env served in a thread; yields the ws:// URL."""
    with serve_in_thread(ENV, options, token) as url:
        yield url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with thread_server() as u:
        yield u


def http(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/ws")


def test_wire_round_trips() -> None:
    task = make_task(3, source="x")
    assert task_from_dict(json.loads(json.dumps(task_to_dict(task)))) == task
    assert task_from_dict(task_to_dict(task)).meta == {"source": "x"}
    for c in CALLS:
        assert call_from_dict(json.loads(json.dumps(call_to_dict(c)))) == c
    r = ToolResult("boom", True, "timeout", "sleep", "call_9", {"ms": 3.0})
    assert result_from_dict(json.loads(json.dumps(result_to_dict(r)))) == r
    t = Transcript([{"role": "user", "content": "q"}], "txt", "max_turns", 4, step=2)
    assert transcript_from_dict(transcript_to_dict(t)) == t


def test_remote_episode_equals_in_process() -> None:
    local = asyncio.run(run_episode(EchoCounterEnv(make_task(), {"start": 5})))
    with thread_server(start=5) as u:
        env = remote(u)
        got = asyncio.run(run_episode(env))
    assert got == local
    assert got[1][1].text == "7" and got[1][3].error_type == "unknown_tool"
    assert got[2] is not None and got[3] is None
    assert env.fatal_error is None and env.server_max_turns == 3 and env.supports_snapshot


def test_router_builds_a_remote_env(url: str) -> None:
    router = EnvRouter({"remote_echo": {"type": "remote", "url": url, "max_turns": 6}})
    env = router.make(make_task())
    assert isinstance(env, RemoteEnv) and env.max_turns == 6

    async def start_and_close() -> None:
        await env.reset()
        await env.close()

    asyncio.run(start_and_close())
    assert env.max_turns == 6 and env.server_max_turns == 3  # config wins


def test_snapshot_and_restore_stay_on_the_server(url: str) -> None:
    async def go() -> tuple[float, float]:
        env = remote(url)
        await env.reset()
        await env.step([ToolCall("count", {"by": 3}, id="a")])
        sid = await env.asnapshot()
        await env.step([ToolCall("count", {"by": 10}, id="b")])
        before = (await env.reward(Transcript([], "", "answer", 1))).parts["count"]
        await env.arestore(sid)
        after = (await env.reward(Transcript([], "", "answer", 1))).parts["count"]
        with pytest.raises(NotImplementedError):
            env.snapshot()
        await env.close()
        return before, after

    assert asyncio.run(go()) == (13.0, 3.0)


def test_token_required_accepted_and_rejected() -> None:
    with thread_server(token="s3cret") as u:
        for opts in ({}, {"token": "wrong"}):
            env = remote(u, **opts)
            start = asyncio.run(env.reset())
            assert start.messages == list(make_task().messages)  # the task's own, to end it
            assert env.fatal_error is not None and "HTTP 403" in env.fatal_error
            reward = asyncio.run(env.reward(Transcript([], "", "answer", 1)))
            assert reward == EnvReward(-1.0, {"env_error": 1.0})
        os.environ["TEST_REMOTE_TOKEN"] = "s3cret"
        try:
            good = remote(u, token_env="TEST_REMOTE_TOKEN")
        finally:
            del os.environ["TEST_REMOTE_TOKEN"]
        assert asyncio.run(run_episode(good))[4].score == 4.0 and good.fatal_error is None
        assert httpx.get(http(u) + "/health").status_code == 200
        assert httpx.get(http(u) + "/info").status_code == 401
        info = httpx.get(http(u) + "/info", headers={"Authorization": "Bearer s3cret"})
        assert info.status_code == 200 and info.json()["env_type"] == ENV


def test_concurrent_sessions_are_independent(url: str) -> None:
    async def one(i: int) -> float:
        env = remote(url, make_task(i))
        await env.reset()
        await env.step([ToolCall("sleep", {"s": 0.4}, id="s"), ToolCall("count", {"by": i})])
        reward = await env.reward(Transcript([], f"answer-{i}", "answer", 1))
        await env.close()
        return reward.score

    async def all_of_them() -> list[float]:
        return list(await asyncio.gather(*(one(i) for i in range(8))))

    EchoCounterEnv.peak_sleeping = 0
    scores = asyncio.run(all_of_them())
    assert scores == [i + 1.0 for i in range(8)]
    assert EchoCounterEnv.peak_sleeping >= 2  # sessions were served at the same time


def test_bad_messages_get_error_replies(url: str) -> None:
    async def go() -> list[dict[str, Any]]:
        replies = []
        async with connect(url, proxy=None) as ws:
            for frame in [
                "not json",
                "[1, 2]",
                json.dumps({"op": "step", "calls": []}),  # before reset
                json.dumps({"op": "bogus"}),
                json.dumps({"op": "reset", "task": {"messages": []}}),  # no task_id
                json.dumps({"op": "reset", "task": task_to_dict(make_task())}),
                json.dumps({"op": "reset", "task": task_to_dict(make_task())}),  # twice
                json.dumps({"op": "step", "calls": "x"}),
                json.dumps({"op": "step", "calls": [{"arguments": {}}]}),  # no name
                json.dumps({"op": "restore", "id": 42}),
                json.dumps({"op": "snapshot"}).encode(),  # binary frames work too
                json.dumps({"op": "close"}),
            ]:
                await ws.send(frame)
                replies.append(json.loads(await ws.recv()))
        return replies

    ops = [r["op"] for r in asyncio.run(go())]
    assert ops == ["error"] * 5 + ["start"] + ["error"] * 4 + ["snapshot", "closed"]


def test_server_env_failures_do_not_raise(url: str) -> None:
    env = remote(url, make_task(fail_reset=True))
    start = asyncio.run(env.reset())
    assert start.messages == list(make_task().messages)
    assert env.fatal_error is not None and "reset exploded" in env.fatal_error
    results = asyncio.run(env.step(CALLS[:2]))
    assert [r.error_type for r in results] == ["transport", "transport"]
    assert httpx.get(http(url) + "/health").status_code == 200  # the server lives on


def test_a_served_step_that_raises_is_an_environment_failure(url: str) -> None:
    """In process, ``Env.step`` raising fails the episode in its environment; served, the same
    bug reached the model as an ``exception`` tool error and the episode was scored."""
    env = remote(url)

    async def go() -> list[ToolResult]:
        await env.reset()
        return await env.step([ToolCall("explode", {}, id="e")])

    results = asyncio.run(go())
    assert env.fatal_error is not None and "step exploded" in env.fatal_error
    assert [r.error_type for r in results] == ["transport"]


def test_timeout_and_refused_connection_end_the_episode(url: str) -> None:
    env = remote(url, timeout_s=0.3)

    async def slow_step() -> list[ToolResult]:
        await env.reset()
        return await env.step([ToolCall("sleep", {"s": 3}, id="z")])

    results = asyncio.run(slow_step())
    assert results[0].error_type == "transport" and results[0].call_id == "z"
    assert env.fatal_error is not None and "no reply" in env.fatal_error

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = remote(f"ws://127.0.0.1:{port}/ws", connect_timeout_s=2)
    asyncio.run(env.reset())
    assert env.fatal_error is not None and "cannot connect" in env.fatal_error
    assert asyncio.run(env.next_user_turn([])) is None


def test_killed_server_mid_episode_ends_it_with_error_reward() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "toolgrpo.cli", "serve-env", ENV, "--port", str(port)]
    cmd += ["--import", "tests.envs.test_remote", "--option", "start=1"]
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath, "TOOLGRPO_ENV_TOKEN": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve-env did not come up"
            time.sleep(0.1)

        async def episode() -> tuple[Any, ...]:
            env = remote(f"ws://127.0.0.1:{port}/ws", error_reward=-2.0, timeout_s=10)
            await env.reset()
            first = await env.step([ToolCall("count", {}, id="c0")])
            proc.kill()
            proc.wait(10)
            second = await env.step([ToolCall("count", {}, id="c1"), ToolCall("echo", id="c2")])
            reward = await env.reward(Transcript([], "", "answer", 2))
            await env.close()
            await env.close()
            return first, second, reward, env.fatal_error

        first, second, reward, fatal = asyncio.run(episode())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert first[0].text == "2"
    assert [(r.error_type, r.call_id) for r in second] == [("transport", "c1"), ("transport", "c2")]
    assert fatal is not None and "connection lost" in fatal
    assert reward == EnvReward(-2.0, {"env_error": 1.0})


def test_options_and_cli_guards(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from toolgrpo.cli import main

    for bad in ({}, {"url": "http://x"}, {"url": "ws://x/ws", "tiemout_s": 1}):
        with pytest.raises(EnvConfigError):
            RemoteOptions.parse(bad)
    with pytest.raises(EnvConfigError, match="NOT_SET_ANYWHERE"):
        RemoteOptions.parse({"url": "ws://x/ws", "token_env": "NOT_SET_ANYWHERE"})
    assert parse_options(["k=3", "s=abc", "f=false", "e="]) == {
        "k": 3,
        "s": "abc",
        "f": False,
        "e": "",
    }

    monkeypatch.delenv("TOOLGRPO_ENV_TOKEN", raising=False)
    assert main(["serve-env", ENV, "--host", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err
    assert main(["serve-env", "no_such_env_type"]) == 2
    assert "unknown environment type" in capsys.readouterr().err

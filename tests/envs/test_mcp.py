"""The ``mcp`` environment type (issue #20 item 4) against a small MCP server the test starts
itself (stdio, and streamable HTTP on 127.0.0.1). New on this branch: main has no such type."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from toolgrpo.data.task import Task  # noqa: E402
from toolgrpo.envs.base import Transcript  # noqa: E402
from toolgrpo.envs.registry import EnvConfigError, EnvRouter  # noqa: E402
from toolgrpo.rollout.rollback import SnapshotUnsupported, check_snapshot_support  # noqa: E402
from toolgrpo.tools.types import ToolCall  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_server.py"))
TASK = Task("m1", ({"role": "user", "content": "2+3?"},), "5", "test", "tools")


def router(**opts) -> EnvRouter:
    return EnvRouter({"tools": {"type": "mcp", "max_turns": 3, **opts}})


async def episode(env, calls):
    start = await env.reset()
    try:
        results = await env.step(calls)
        msgs = [*start.messages, {"role": "assistant", "content": "<answer>5</answer>"}]
        reward = await env.reward(Transcript(msgs, "", "answer", 1))
        return start, results, reward
    finally:
        await env.close()


def test_stdio_server_tools_become_specs_and_calls_become_tool_steps():
    env = router(command=[sys.executable, SERVER], timeout_s=2).make(TASK)
    calls = [
        ToolCall("add", {"a": 2, "b": 3}, id="call_0"),
        ToolCall("boom", {"x": "y"}, id="call_1"),
        ToolCall("nope", {}, id="call_2"),
        ToolCall("slow", {"seconds": 5}, id="call_3"),
        ToolCall("", parse_error="not JSON", id="call_4"),
    ]
    start, results, reward = asyncio.run(episode(env, calls))
    names = {t["function"]["name"] for t in start.tools}
    assert names == {"add", "bump", "boom", "slow", "pid"}  # the pool's reset is hidden
    add = next(t for t in start.tools if t["function"]["name"] == "add")["function"]
    assert set(add["parameters"]["properties"]) == {"a", "b"}
    assert start.messages[0]["role"] == "system"
    # The slow call's timeout is the environment's failure (the one timeout rule), not the model's.
    assert env.fatal_error == "mcp tool 'slow' timed out after 2s"
    ok, boom, unknown, slow, bad = results
    assert (ok.text, ok.is_error, ok.call_id) == ("5", False, "call_0")
    assert boom.is_error and boom.error_type == "exception" and "boom" in boom.text
    assert unknown.error_type == "unknown_tool" and "add" in unknown.text
    assert slow.error_type == "timeout"
    assert bad.error_type == "parse"
    assert reward.score == 1.0  # <answer>5</answer> against the ground truth


def test_streamable_http_server_on_loopback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        env = router(url=f"http://127.0.0.1:{port}/mcp").make(TASK)
        calls = [ToolCall("bump", {}, id="c0"), ToolCall("add", {"a": 1, "b": 1}, id="c1")]
        _, results, _ = asyncio.run(episode(env, calls))
        assert [r.text for r in results] == ["1", "2"] and env.fatal_error is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # The server is gone: the episode is the environment's failure, not the model's.
    env = router(url=f"http://127.0.0.1:{port}/mcp", connect_timeout_s=5).make(TASK)
    _, results, _ = asyncio.run(episode(env, [ToolCall("add", {"a": 1, "b": 1}, id="c0")]))
    assert env.fatal_error is not None and results[0].error_type == "transport"


def test_bad_config_and_rollback_are_refused_at_startup():
    with pytest.raises(EnvConfigError, match="exactly one of command"):
        router().make(TASK)
    with pytest.raises(EnvConfigError, match="unknown option"):
        router(command="x", colour="red").make(TASK)
    with pytest.raises(EnvConfigError, match="module:function"):
        router(command="x", reward="no_such_module:f").make(TASK)
    with pytest.raises(SnapshotUnsupported):
        check_snapshot_support(router(command=[sys.executable, SERVER]), [TASK])


def test_stdio_servers_get_a_default_concurrency_cap():
    """Was: no cap, so 128 concurrent episodes started ~100 servers at once and 14 % missed the
    reset deadline; 32 at a time failed none. ``max_concurrency`` still decides when given
    (null lifts the cap); an HTTP server is the user's to size."""
    from toolgrpo.envs.mcp import STDIO_MAX_CONCURRENCY

    def cap(r: EnvRouter) -> int | None:
        slots = r._slots.get("tools")
        return slots.limit if slots is not None else None

    assert STDIO_MAX_CONCURRENCY == 32
    assert cap(router(command=[sys.executable, SERVER])) == 32
    assert cap(router(command=[sys.executable, SERVER], max_concurrency=4)) == 4
    assert cap(router(command=[sys.executable, SERVER], max_concurrency=None)) is None
    assert cap(router(url="http://127.0.0.1:1/mcp")) is None
    assert router(command=[sys.executable, SERVER]).spec("tools").max_concurrency == 32

"""Isolated tools (issue 15, item 1): a worker process per call, killed at the deadline and
replaced, shared by every event loop and thread of the process, memory-bounded."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from tests.tools import isolated_fns as fns
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.tools import ToolCall, dict_tool, function_tool, run_tool_calls
from toolgrpo.tools.shared_pool import shared_pool, shutdown_shared_pool

TOOLS = {
    t.name: t
    for t in [
        function_tool(fns.worker_pid, isolated=True),
        function_tool(fns.spin, isolated=True),
        function_tool(fns.allocate, isolated=True),
        function_tool(fns.fail, isolated=True),
        function_tool(fns.fail_oddly, isolated=True),
    ]
}


@pytest.fixture(autouse=True)
def fresh_pool():
    shutdown_shared_pool()
    yield
    shutdown_shared_pool()


def call(name: str, timeout_s: float = 5.0, memory_limit_mb: float = 1024, **arguments):
    calls = [ToolCall(name, arguments, id="call_0")]
    return asyncio.run(run_tool_calls(TOOLS, calls, timeout_s, None, memory_limit_mb))[0]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")  # killed, not yet reaped
    except FileNotFoundError:
        return True


def test_runs_in_another_process_reused_across_event_loops() -> None:
    first = call("worker_pid")
    assert not first.is_error and int(first.text) != os.getpid()
    assert call("worker_pid").text == first.text  # a second asyncio.run, the same worker
    assert shared_pool().stats()["started"] == 1


def test_worker_killed_at_the_deadline_is_replaced() -> None:
    """A runaway call is stopped at its deadline (its worker killed), and the next call gets a
    new worker."""
    pid = int(call("worker_pid").text)
    start = time.monotonic()
    result = call("spin", timeout_s=1.0)
    took = time.monotonic() - start
    assert result.error_type == "timeout" and 1.0 <= took < 3.0, (result, took)
    assert "timed out after 1s and was stopped" in result.text
    new_pid = int(call("worker_pid").text)
    assert new_pid != pid and gone(pid)
    assert shared_pool().stats()["started"] == 2


def test_errors_come_back_as_the_model_would_see_them_in_a_thread() -> None:
    assert call("fail").text == "Error: ValueError: bad input"
    assert call("fail_oddly").text.startswith("Error: RuntimeError: Unpicklable")
    assert call("worker_pid").is_error is False  # the worker survived both


def test_memory_limit_is_an_error_not_a_machine_problem() -> None:
    result = call("allocate", memory_limit_mb=64, megabytes=512)
    assert result.error_type == "exception" and "out of memory (limit 64 MB)" in result.text
    assert call("allocate", memory_limit_mb=64, megabytes=8).text == str(8 * 2**20)


def test_calls_wait_for_a_worker_and_their_deadline_starts_when_they_run() -> None:
    """With every worker busy on a runaway call, a cheap isolated call waits and then succeeds:
    a slow call in one episode is never scored as a timeout of another's."""
    shared_pool().max_workers = 2

    async def main() -> list:
        bombs = [run_tool_calls(TOOLS, [ToolCall("spin", {}, id=f"b{i}")], 1.0) for i in range(2)]
        tasks = [asyncio.create_task(b) for b in bombs]
        await asyncio.sleep(0.3)
        cheap = await run_tool_calls(TOOLS, [ToolCall("worker_pid", {}, id="c")], 1.0)
        return [*(await asyncio.gather(*tasks)), cheap]

    *bombs, (cheap,) = asyncio.run(main())
    assert [r[0].error_type for r in bombs] == ["timeout", "timeout"]
    assert not cheap.is_error, cheap


def test_cheap_thread_tools_are_not_starved_by_runaway_isolated_ones() -> None:
    """Issue 15: six slow `solve` calls filled the default thread pool and `calculate('1+1')` in
    other episodes timed out. Here six runaway isolated calls run in six episodes while cheap
    calls in other episodes answer at once."""

    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    tools = [function_tool(add), TOOLS["spin"]]

    async def main() -> tuple[list, float]:
        envs = [ToolEnv([], tools, lambda t: 0.0, timeout_s=1.5) for _ in range(8)]
        bombs = [asyncio.create_task(e.step([ToolCall("spin", {})])) for e in envs[:6]]
        await asyncio.sleep(0.2)
        start = time.monotonic()
        cheap = await asyncio.gather(
            *(e.step([ToolCall("add", {"a": 1, "b": 1})]) for e in envs[6:])
        )
        took = time.monotonic() - start
        await asyncio.gather(*bombs)
        return cheap, took

    cheap, took = asyncio.run(main())
    assert [r[0].text for r in cheap] == ["2", "2"] and took < 0.5, (cheap, took)


def test_pool_serves_several_threads_each_with_its_own_loop() -> None:
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(call("worker_pid"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 3 and not any(r.is_error for r in out)


def test_shutdown_kills_the_workers() -> None:
    pid = int(call("worker_pid").text)
    shutdown_shared_pool()
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)
    assert not call("worker_pid").is_error  # a new pool on demand


def test_a_cancelled_caller_does_not_leak_its_worker() -> None:
    async def main() -> None:
        task = asyncio.create_task(TOOLS["spin"]({}, timeout_s=30))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert shared_pool().stats()["live"] == 0  # killed, not left spinning
    assert not call("worker_pid").is_error


def test_declaring_a_tool_isolated_checks_it_can_be_sent() -> None:
    with pytest.raises(ValueError, match="lambda or a nested function"):
        dict_tool({"name": "f"}, lambda: "x", isolated=True)

    async def coro() -> str:
        return "x"

    with pytest.raises(ValueError, match="async function cannot be isolated"):
        dict_tool({"name": "g"}, coro, isolated=True)


def test_a_worker_killed_from_outside_is_replaced() -> None:
    """A worker that dies mid-call (OOM killer, a crash in C code) is a crash result, not a hang;
    one that died while idle is replaced without the next call noticing."""
    import signal

    pid = int(call("worker_pid").text)

    async def main():
        task = asyncio.create_task(run_tool_calls(TOOLS, [ToolCall("spin", {})], 30))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        return (await task)[0]

    start = time.monotonic()
    result = asyncio.run(main())
    assert result.error_type == "exception" and "its worker process died" in result.text
    assert time.monotonic() - start < 5
    idle_pid = int(call("worker_pid").text)
    assert idle_pid != pid
    os.kill(idle_pid, signal.SIGKILL)
    time.sleep(0.2)
    again = call("worker_pid")
    assert not again.is_error and int(again.text) not in (pid, idle_pid)


def test_tool_env_passes_its_memory_limit_to_the_worker() -> None:
    env = ToolEnv([], [TOOLS["allocate"]], lambda t: 0.0, timeout_s=5, memory_limit_mb=64)
    (result,) = asyncio.run(env.step([ToolCall("allocate", {"megabytes": 512})]))
    assert "out of memory (limit 64 MB)" in result.text


def test_no_worker_at_all_is_the_environments_failure(monkeypatch) -> None:
    """If no worker process can be started, the step raises (the episode ends as an
    environment error) instead of telling the model its call failed."""
    from toolgrpo.tools.isolated import IsolationUnavailable
    from toolgrpo.tools.worker_process import Zygote

    def broken(self):
        raise OSError("fork refused")

    monkeypatch.setattr(Zygote, "fork", broken)
    env = ToolEnv([], [TOOLS["worker_pid"]], lambda t: 0.0, timeout_s=5)
    with pytest.raises(IsolationUnavailable, match="fork refused"):
        asyncio.run(env.step([ToolCall("worker_pid", {})]))


def test_a_decorated_tool_can_be_isolated_and_its_import_is_not_timed() -> None:
    """The worker imports the tool's module (seconds: transformers) before the 1 s deadline."""
    from tests.tools.isolated_decorated import decorated

    tools = {"decorated": decorated, "worker_pid": TOOLS["worker_pid"]}
    assert not call("worker_pid").is_error  # a pool whose zygote did not import the module
    calls = [ToolCall("decorated", {"n": 21})]
    (result,) = asyncio.run(run_tool_calls(tools, calls, timeout_s=1.0))
    assert (result.text, result.is_error, decorated.isolated) == ("42", False, True)

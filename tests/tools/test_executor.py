from __future__ import annotations

import asyncio
import threading
import time

import pytest

from toolgrpo.tools import (
    ERROR_TYPES,
    Tool,
    ToolCall,
    ToolResult,
    dict_tool,
    function_tool,
    parse_tool_calls,
    run_tool_calls,
    truncate_text,
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


class Boom(BaseException):
    """Not an Exception: a tool raising it must still not escape."""


async def never_returns() -> str:
    await asyncio.Event().wait()
    return "unreachable"


def raises(exc: BaseException):
    def fn() -> str:
        raise exc

    return fn


async def raises_cancelled() -> str:
    raise asyncio.CancelledError()


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        function_tool(add),
        dict_tool({"name": "fails"}, raises(ValueError("bad input"))),
        dict_tool({"name": "boom"}, raises(Boom("deep"))),
        dict_tool({"name": "own_timeout"}, raises(TimeoutError("upstream slow"))),
        dict_tool({"name": "hangs"}, never_returns),
        dict_tool({"name": "returns_set"}, lambda: {1}),
        dict_tool({"name": "cancelled"}, raises_cancelled),
        dict_tool({"name": "own_error"}, lambda: ToolResult("nope", True, "exception")),
    ]
}


def run(calls: list[ToolCall], tools=TOOLS, **kw) -> list[ToolResult]:
    return asyncio.run(run_tool_calls(tools, calls, **kw))


def one(name: str, timeout_s: float = 5.0, **arguments) -> ToolResult:
    (result,) = run([ToolCall(name, arguments, id="call_0")], timeout_s=timeout_s)
    assert result.name == name and result.call_id == "call_0"
    return result


def test_success() -> None:
    r = one("add", a=2, b=3)
    assert (r.text, r.is_error, r.error_type) == ("5", False, None)


def test_parse_error_shows_the_expected_format() -> None:
    (r,) = run(parse_tool_calls("<tool_call>{oops}</tool_call>"))
    assert r.is_error and r.error_type == "parse" and r.call_id == "call_0"
    assert "invalid JSON" in r.text and "{oops}" in r.text
    assert '<tool_call>{"name": ' in r.text


def test_unknown_tool_lists_the_available_ones() -> None:
    r = one("subtract", a=1)
    assert r.error_type == "unknown_tool"
    assert "'subtract'" in r.text and "add, fails" in r.text


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"a": 1}, "'b'"),
        ({"a": 1, "b": "2"}, "'b'"),
        ({"b": True}, "'a'"),
        ({"a": 1, "b": 2, "c": 3}, "'c'"),  # not in the schema nor the signature
    ],
)
def test_invalid_arguments_name_the_field(arguments, field) -> None:
    r = one("add", **arguments)
    assert r.error_type == "invalid_arguments"
    assert r.text.startswith("Error: invalid arguments for tool 'add'") and field in r.text


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("fails", "Error: ValueError: bad input"),
        ("boom", "Error: Boom: deep"),
        ("own_timeout", "Error: TimeoutError: upstream slow"),  # the tool's, not our limit
        ("returns_set", "Error: ToolOutputError: tool 'returns_set' returned a set"),
        ("cancelled", "Error: tool 'cancelled' was cancelled"),
    ],
)
def test_exceptions_become_error_results(name, text) -> None:
    r = one(name)
    assert r.is_error and r.error_type == "exception"
    assert r.text.startswith(text)
    assert "Traceback" not in r.text


def test_timeout() -> None:
    r = one("hangs", timeout_s=0.05)
    assert r.error_type == "timeout"
    assert r.text == "Error: tool 'hangs' timed out after 0.05s"


def test_a_tools_own_error_result_is_kept() -> None:
    r = one("own_error")
    assert (r.text, r.is_error, r.error_type) == ("nope", True, "exception")


def test_every_failure_class_in_one_turn_keeps_call_order() -> None:
    text = "".join(
        f"<tool_call>{body}</tool_call>"
        for body in [
            '{"name": "add", "arguments": {"a": 1, "b": 2}}',
            "not json",
            '{"name": "nope", "arguments": {}}',
            '{"name": "add", "arguments": {"a": "x", "b": 2}}',
            '{"name": "fails", "arguments": {}}',
            '{"name": "hangs", "arguments": {}}',
            '{"name": "add", "arguments": {"a": 4, "b": 5}}',
        ]
    )
    results = run(parse_tool_calls(text), timeout_s=0.05)
    assert [r.call_id for r in results] == [f"call_{i}" for i in range(7)]
    assert [r.error_type for r in results] == [
        None,
        "parse",
        "unknown_tool",
        "invalid_arguments",
        "exception",
        "timeout",
        None,
    ]
    assert results[0].text == "3" and results[-1].text == "9"
    assert all(r.error_type in ERROR_TYPES for r in results if r.is_error)


def test_async_calls_run_concurrently() -> None:
    # Each call waits until all three have started; run one at a time, the first would time out.
    started: list[str] = []

    async def main() -> list[ToolResult]:
        all_started = asyncio.Event()

        async def rendezvous(tag: str) -> str:
            started.append(tag)
            if len(started) == 3:
                all_started.set()
            await asyncio.wait_for(all_started.wait(), 5)
            return tag

        tools = {"meet": dict_tool({"name": "meet"}, rendezvous)}
        calls = [ToolCall("meet", {"tag": t}, id=f"call_{i}") for i, t in enumerate("xyz")]
        return await run_tool_calls(tools, calls, timeout_s=None)

    results = asyncio.run(main())
    assert [r.text for r in results] == ["x", "y", "z"]
    assert not any(r.is_error for r in results)


def test_sync_calls_run_concurrently_in_threads() -> None:
    barrier = threading.Barrier(3, timeout=5)

    def meet(tag: str) -> str:
        barrier.wait()  # raises BrokenBarrierError unless three threads arrive together
        return tag

    tools = {"meet": dict_tool({"name": "meet"}, meet)}
    calls = [ToolCall("meet", {"tag": t}, id=f"call_{i}") for i, t in enumerate("abc")]
    assert [r.text for r in run(calls, tools, timeout_s=None)] == ["a", "b", "c"]


def test_results_follow_call_order_not_finish_order() -> None:
    finished: list[int] = []

    async def main() -> list[ToolResult]:
        gates = [asyncio.Event() for _ in range(3)]

        async def step(i: int) -> str:
            if i < 2:  # call i waits for call i + 1: the last call finishes first
                await gates[i + 1].wait()
            finished.append(i)
            gates[i].set()
            return str(i)

        tools = {"step": dict_tool({"name": "step"}, step)}
        calls = [ToolCall("step", {"i": i}, id=f"call_{i}") for i in range(3)]
        return await run_tool_calls(tools, calls, timeout_s=5)

    results = asyncio.run(main())
    assert finished == [2, 1, 0]
    assert [r.text for r in results] == ["0", "1", "2"]
    assert [r.call_id for r in results] == ["call_0", "call_1", "call_2"]


@pytest.mark.parametrize(("max_parallel", "expected"), [(None, 4), (1, 1), (2, 2)])
def test_max_parallel_limits_concurrency(max_parallel, expected) -> None:
    active = peak = 0

    async def work() -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        for _ in range(5):
            await asyncio.sleep(0)
        active -= 1
        return "done"

    tools = {"work": dict_tool({"name": "work"}, work)}
    calls = [ToolCall("work", id=f"call_{i}") for i in range(4)]
    results = run(calls, tools, max_parallel=max_parallel)
    assert [r.text for r in results] == ["done"] * 4
    assert peak == expected


def test_no_calls() -> None:
    assert run([]) == []


# ---- truncation ------------------------------------------------------------------------------

TEXT = " ".join(f"word{i}" for i in range(200))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_truncate_sides(tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    n, keep = len(ids), 20
    assert n > 3 * keep

    def dec(part):
        return tokenizer.decode(part, skip_special_tokens=False)

    marker = f"...(truncated {n - keep} tokens)"
    right = truncate_text(tokenizer, TEXT, keep, "right")
    left = truncate_text(tokenizer, TEXT, keep, "left")
    middle = truncate_text(tokenizer, TEXT, keep, "middle")
    assert right == f"{dec(ids[:keep])}\n{marker}" and right.startswith("word0 ")
    assert left == f"{marker}\n{dec(ids[-keep:])}" and left.endswith("word199")
    assert middle == f"{dec(ids[:10])}\n{marker}\n{dec(ids[-10:])}"
    assert middle.startswith("word0 ") and middle.endswith("word199")
    assert truncate_text(tokenizer, TEXT, keep) == right


def test_truncate_no_op_cases(tokenizer) -> None:
    n = len(tokenizer.encode(TEXT, add_special_tokens=False))
    for side in ("right", "left", "middle"):
        assert truncate_text(tokenizer, TEXT, 0, side) == TEXT
        assert truncate_text(tokenizer, TEXT, -1, side) == TEXT
        assert truncate_text(tokenizer, TEXT, n, side) == TEXT
        assert truncate_text(tokenizer, "", 5, side) == ""
    assert truncate_text(tokenizer, TEXT, n - 1, "right").endswith("...(truncated 1 tokens)")


def test_truncate_rejects_unknown_side(tokenizer) -> None:
    with pytest.raises(ValueError, match="side"):
        truncate_text(tokenizer, TEXT, 5, "both")


def test_a_timed_out_thread_tool_does_not_hold_up_asyncio_run() -> None:
    """Issue 15: a sync tool past its deadline kept running in the loop's default executor, and
    `asyncio.run` joined that executor at exit, so the step lasted as long as the tool."""
    release = threading.Event()

    def stuck() -> str:
        release.wait(20)
        return "late"

    tools = {"stuck": dict_tool({"name": "stuck"}, stuck)}
    start = time.monotonic()
    try:
        (result,) = run([ToolCall("stuck", {}, id="call_0")], tools, timeout_s=0.2)
        took = time.monotonic() - start
    finally:
        release.set()
    assert result.error_type == "timeout" and took < 3, (result, took)


def test_slow_thread_tools_do_not_starve_other_calls() -> None:
    """Issue 15: six slow calls filled the default thread pool (2 cores: 6 threads), so a later
    cheap call waited behind them and was scored as a timeout."""
    release = threading.Event()

    def slow() -> str:
        release.wait(20)
        return "late"

    tools = {"slow": dict_tool({"name": "slow"}, slow), "add": function_tool(add)}

    async def main() -> list[ToolResult]:
        slow_calls = [ToolCall("slow", {}, id=f"s{i}") for i in range(8)]
        blocked = asyncio.create_task(run_tool_calls(tools, slow_calls, timeout_s=5))
        await asyncio.sleep(0.2)
        cheap = await run_tool_calls(tools, [ToolCall("add", {"a": 1, "b": 1})], timeout_s=1)
        release.set()
        await blocked
        return cheap

    try:
        (result,) = asyncio.run(main())
    finally:
        release.set()
    assert (result.text, result.is_error) == ("2", False)

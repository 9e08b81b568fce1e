"""The calculator environment: a bounded evaluator, sympy solving behind a token whitelist, and an
exact numeric reward, driven through the registry as the trainer does."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.calculator import (
    SYSTEM_PROMPT,
    calculate,
    calculator_reward,
    final_answer,
    numbers_match,
    solve,
)
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.tools.parser import parse_tool_calls


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("4817 * 293 - 1205", "1410176"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),  # the model's habit; there is no XOR here
        ("sqrt(16) + abs(-3)", "7"),
        ("10 / 4", "2.5"),
        ("(7 // 2) * (7 % 3)", "3"),
        ("round(3.14159, 2)", "3.14"),
        ("max(3, 9, 4) - min(5, 2)", "7"),
        ("log(100, 10) + exp(0) + cos(0) + sin(0)", "4"),
        ("-(-5) + +2", "7"),
        ("2 * pi", "6.28318530718"),
    ],
)
def test_calculate(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("().__class__", "Attribute"),
        ("(1).__class__.__bases__", "Attribute"),
        ("x + 1", "not defined"),
        ("__import__('os')", "not defined"),
        ("open('/etc/passwd')", "not defined"),
        ("'a' * 10", "not a number"),
        ("[1] * 10", "List"),
        ("(lambda: 1)()", "Lambda"),
        ("1 < 2", "Compare"),
        ("1; 2", "invalid"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 1000", "too large"),
        ("10 ** 60 * 10 ** 60", "too large"),
        ("0.5 ** -1000", "too large"),
        ("exp(1000)", "cannot evaluate"),
        ("1 / 0", "division by zero"),
        ("sqrt(-1)", "domain"),
        ("1,234 + 1", "commas"),
        ("sqrt", "not a number"),
        ("1 +" + " 1 +" * 200 + " 1", "longer than"),
    ],
)
def test_calculate_refuses(expression, message):
    with pytest.raises(ValueError, match=message):
        calculate(expression)


@pytest.mark.parametrize(
    "equation, variable, expected",
    [
        ("7x - 12 = 37", "x", "x = 7"),
        ("3(x + 14) = 5x - 18", "x", "x = 30"),
        ("x^2 + 3x - 40 = 0", "x", "x = -8; x = 5"),
        ("4x + 7 = 10", "x", "x = 3/4 (~ 0.75)"),
        ("2*y + 1", "y", "y = -1/2 (~ -0.5)"),
        ("x**2 = 2", "x", "x = -sqrt(2) (~ -1.41421356237); x = sqrt(2) (~ 1.41421356237)"),
        ("x^2 = -1", "x", "no real solution for x"),
        ("x = x", "x", "every real x is a solution"),
        ("x = x + 1", "x", "no real solution for x"),
        ("0.5x == 1.25", "x", "x = 2.5"),
    ],
)
def test_solve(equation, variable, expected):
    assert solve(equation, variable) == expected


@pytest.mark.parametrize(
    "equation, variable, message",
    [
        ("__import__('os').system('ls')", "x", "may only use"),
        ("x.is_real = 1", "x", "may only use"),
        ("eval(x) = 1", "x", "unknown name 'eval'"),
        ("y = 2", "x", "unknown name 'y'"),
        ("x^99 = 1", "x", "exponents up to 6"),
        ("9^9^9 = x", "x", "exponents up to 6"),
        ("x^x = 4", "x", "exponents up to 6"),
        ("x*x*x*x*x*x*x = 1", "x", "degree 6"),
        ("x = 1 = 2", "x", "at most one"),
        ("= 3", "x", "non-empty"),
        ("x +* 2 = 1", "x", "cannot solve"),
        ("x = 1", "xy", "single lowercase letter"),
        ("2x = 3.5e400", "x", "out of range"),  # sympy builds 10**e: 1e999999 ran for minutes
        ("x = 1e-99999", "x", "out of range"),  # was silently x = 0
    ],
)
def test_solve_refuses(equation, variable, message):
    with pytest.raises(ValueError, match=message):
        solve(equation, variable)


@pytest.mark.parametrize(
    "answer, truth, ok",
    [
        ("1410176", "1410176", True),
        ("1,410,176", "1410176", True),
        ("0.75", "3/4", True),
        ("3/4", "0.75", True),
        ("x = 7", "7", True),
        ("$28.60", "28.6", True),
        ("28.6000001", "28.6", True),  # relative tolerance 1e-6
        ("28.7", "28.6", False),
        ("1,41,0176", "1410176", False),  # not a thousands grouping
        ("seven", "7", False),
        ("", "7", False),
    ],
)
def test_numbers_match(answer, truth, ok):
    assert numbers_match(answer, truth) is ok


def transcript(*assistant: str) -> Transcript:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    for text in assistant:
        msgs += [{"role": "assistant", "content": text}, {"role": "tool", "content": "r"}]
    return Transcript(msgs[:-1], text="", stop_reason="answer", num_turns=len(assistant))


def test_reward_right_wrong_missing():
    right = calculator_reward(transcript("<answer>41</answer> then <answer>42</answer>"), "42")
    assert (right.score, right.parts) == (1.0, {"correct": 1.0, "has_answer": 1.0})
    wrong = calculator_reward(transcript("<answer>41</answer>"), "42")
    assert (wrong.score, wrong.parts) == (0.0, {"correct": 0.0, "has_answer": 1.0})
    # Only the final assistant message counts: an answer in an earlier turn is scratch work.
    missing = calculator_reward(transcript("<answer>42</answer>", "no idea"), "42")
    assert (missing.score, missing.parts) == (0.0, {"correct": 0.0, "has_answer": 0.0})
    assert final_answer([{"role": "user", "content": "<answer>1</answer>"}]) is None


def make_env(user: str = "What is 4817 * 293 - 1205?", truth: str = "1410176", **options):
    task = Task("calc#0", ({"role": "user", "content": user},), truth, "calculator", "calculator")
    router = EnvRouter({"calculator": options} if options else None)
    return router.make(task)


def test_env_episode_through_router():
    async def episode():
        env = make_env(max_turns=3, timeout_s=5)
        assert env.max_turns == 3
        start = await env.reset()
        assert start.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert start.messages[1]["content"] == "What is 4817 * 293 - 1205?"
        assert {t["function"]["name"] for t in start.tools} == {"calculate", "solve"}
        turn = (
            '<tool_call>{"name": "calculate", "arguments": {"expression": "4817 * 293 - 1205"}}'
            '</tool_call>\n<tool_call>{"name": "solve", "arguments": {"equation": "7x = 14"}}'
            '</tool_call>\n<tool_call>{"name": "calculate", "arguments": {"expression": "x"}}'
            "</tool_call>"
        )
        results = await env.step(parse_tool_calls(turn))
        assert [r.text for r in results[:2]] == ["1410176", "x = 2"]
        assert results[2].is_error and "not defined" in results[2].text
        messages = [*start.messages, {"role": "assistant", "content": turn}]
        messages += [r.to_message() for r in results]
        messages.append({"role": "assistant", "content": "<answer>1,410,176</answer>"})
        return await env.reward(Transcript(messages, "", "answer", 2))

    reward = asyncio.run(episode())
    assert reward.score == 1.0 and reward.parts["has_answer"] == 1.0


def test_env_keeps_a_task_system_prompt_and_refuses_unknown_options():
    task = Task(
        "calc#1",
        ({"role": "system", "content": "mine"}, {"role": "user", "content": "q"}),
        "1",
        "calculator",
        "calculator",
    )
    start = asyncio.run(EnvRouter().make(task).reset())
    assert [m["content"] for m in start.messages] == ["mine", "q"]
    with pytest.raises(EnvConfigError, match="top_k"):
        make_env(top_k=3)


def test_env_options_are_checked():
    with pytest.raises(EnvConfigError, match="memory_limit_mb must be a number >= 0"):
        make_env(memory_limit_mb=-1)
    with pytest.raises(EnvConfigError, match="num_workers must be a number >= 1"):
        make_env(num_workers=0)
    with pytest.raises(EnvConfigError, match="timeout_s"):
        make_env(timeout_s="soon")
    env = make_env(timeout_s=2, memory_limit_mb=256)
    assert (env.timeout_s, env.memory_limit_mb) == (2.0, 256.0)
    assert env.tools["solve"].isolated and not env.tools["calculate"].isolated


# A step with the 12-character call, an input that passes every guard but keeps sympy
# busy for minutes, and a cheap call, with a coroutine ticking beside it. Run in a child
# process so that the stall on main is cut off by the test's own timeout.
_BOMB_STEP = """
import asyncio, json, sys, time
from tests.envs.test_calculator import make_env
from toolgrpo.tools import ToolCall

async def main():
    env = make_env(timeout_s=1)
    await env.step([ToolCall("solve", {"equation": "2x = 6"})])  # the pool's first start
    start = time.monotonic()
    ticks = 0
    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1
    ticker = asyncio.create_task(tick())
    calls = [ToolCall("solve", {"equation": "x = 1e999999"}),
             ToolCall("solve", {"equation": "sin(x)^6 + cos(x)^5 = 1/3"}),
             ToolCall("calculate", {"expression": "1+1"})]
    results = await env.step(calls)
    ticker.cancel()
    return [[r.error_type, r.text] for r in results], ticks, start

results, ticks, start = asyncio.run(main())  # the step, then asyncio.run's shutdown
print(json.dumps({"results": results, "ticks": ticks, "took": time.monotonic() - start}))
"""


def test_a_solve_bomb_does_not_stall_the_step():
    """Issue 15: `solve("x = 1e999999")` froze the event loop for minutes (sympy holding the
    GIL), and a timed-out call kept `asyncio.run` waiting for its thread. With a 1 s tool timeout
    the whole step (and `asyncio.run`) now ends within a few seconds, the loop keeps ticking, and
    the cheap call in the same turn answers."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_STEP],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    (guard, guard_text), (bomb, bomb_text), (cheap, cheap_text) = report["results"]
    assert guard == "exception" and "out of range" in guard_text
    assert bomb == "timeout" and "was stopped" in bomb_text
    assert (cheap, cheap_text) == (None, "2")
    assert report["took"] < 1 + 3, report  # the timeout, worker starts, slack for load
    assert report["ticks"] >= 5, report  # the loop was never frozen for the step
    assert time.monotonic() - start < 25


def test_isolated_solve_behind_serve_env():
    """`toolgrpo serve-env calculator` (uvicorn's event loop, in a thread here): a runaway
    `solve` is stopped at the server's timeout and the cheap call beside it answers."""
    import socket
    import threading

    import uvicorn

    from toolgrpo.envs.remote import RemoteEnv, RemoteOptions
    from toolgrpo.envs.server import create_app
    from toolgrpo.tools import ToolCall

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app("calculator", {"timeout_s": 1}, None)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    url = f"ws://127.0.0.1:{sock.getsockname()[1]}/ws"
    task = Task("calc#0", ({"role": "user", "content": "q"},), "1", "calculator", "calculator")

    async def episode():
        env = RemoteEnv(task, RemoteOptions.parse({"url": url, "timeout_s": 30}))
        await env.reset()
        await env.step([ToolCall("solve", {"equation": "2x = 6"}, id="w")])  # first worker
        start = time.monotonic()
        calls = [
            ToolCall("solve", {"equation": "sin(x)^6 + cos(x)^5 = 1/3"}, id="b"),
            ToolCall("calculate", {"expression": "1+1"}, id="c"),
        ]
        results = await env.step(calls)
        took = time.monotonic() - start
        await env.close()
        return results, took

    try:
        (bomb, cheap), took = asyncio.run(episode())
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert bomb.error_type == "timeout" and (cheap.text, cheap.is_error) == ("2", False)
    assert took < 1 + 3, took

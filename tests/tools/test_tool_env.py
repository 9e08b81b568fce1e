from __future__ import annotations

import asyncio

import pytest

from toolgrpo.envs.base import Env, EnvReward, Transcript
from toolgrpo.envs.tool_env import RewardFunctionError, ToolEnv
from toolgrpo.tools import ToolCall, dict_tool, function_tool

MESSAGES = [
    {"role": "system", "content": "You call tools."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


TRANSCRIPT = Transcript(messages=list(MESSAGES), text="...5", stop_reason="answer", num_turns=2)


def make(reward_fn=lambda t: 1.0, **kw) -> ToolEnv:
    return ToolEnv(MESSAGES, [function_tool(add)], reward_fn, **kw)


def test_reset_gives_a_copy_of_the_messages_and_the_specs() -> None:
    env = make(max_turns=3)
    assert isinstance(env, Env) and env.max_turns == 3 and not env.single_turn
    start = asyncio.run(env.reset())
    assert start.messages == MESSAGES
    assert start.tools == [function_tool(add).spec()]
    start.messages[1]["content"] = "changed"
    start.messages.append({"role": "assistant", "content": "x"})
    assert asyncio.run(env.reset()).messages == MESSAGES


def test_step_runs_the_calls_in_order() -> None:
    env = make()
    calls = [
        ToolCall("add", {"a": 2, "b": 3}, id="call_0"),
        ToolCall("mul", {"a": 2, "b": 3}, id="call_1"),
    ]
    results = asyncio.run(env.step(calls))
    assert [(r.text, r.error_type, r.call_id) for r in results][0] == ("5", None, "call_0")
    assert results[1].error_type == "unknown_tool" and results[1].call_id == "call_1"


def test_step_applies_the_timeout() -> None:
    async def hang() -> str:
        await asyncio.Event().wait()
        return ""

    env = ToolEnv(MESSAGES, [dict_tool({"name": "hang"}, hang)], lambda t: 0.0, timeout_s=0.01)
    (r,) = asyncio.run(env.step([ToolCall("hang", id="call_0")]))
    assert r.error_type == "timeout"


def test_reward_accepts_floats_rewards_and_coroutines() -> None:
    async def async_reward(t: Transcript) -> EnvReward:
        return EnvReward(0.5, {"format": 0.5})

    assert asyncio.run(make(lambda t: 1).reward(TRANSCRIPT)) == EnvReward(1.0)
    assert asyncio.run(make(lambda t: float(t.num_turns)).reward(TRANSCRIPT)).score == 2.0
    assert asyncio.run(make(async_reward).reward(TRANSCRIPT)) == EnvReward(0.5, {"format": 0.5})


@pytest.mark.parametrize("bad", ["raises", "wrong_type", "async_raises"])
def test_a_failing_reward_fn_is_the_environments_failure(bad) -> None:
    """A broken reward function used to score the episode 0 as if the model had failed; it is
    the environment's failure: it raises, and the episode loop leaves the episode out."""

    def raises(t: Transcript) -> float:
        raise KeyError("ground_truth")

    async def async_raises(t: Transcript) -> float:
        raise RuntimeError("judge down")

    fn = {"raises": raises, "wrong_type": lambda t: "1.0", "async_raises": async_raises}[bad]
    with pytest.raises(RewardFunctionError, match="reward function failed"):
        asyncio.run(make(fn).reward(TRANSCRIPT))


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="duplicate tool name 'add'"):
        ToolEnv(MESSAGES, [function_tool(add), dict_tool({"name": "add"}, add)], lambda t: 0.0)
    with pytest.raises(ValueError, match="max_turns"):
        make(max_turns=0)

"""One timeout rule for every environment type: a tool or environment call that times out is the
environment's failure (the episode is left out of training), never the model's error. Before,
MCP returned a slow call to the model as a ``timeout`` result and scored the episode as usual,
while OpenEnv failed the environment; in-process tools and BFCL did as MCP."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from tests.rollout.test_multi_turn import (
    CALL,
    TASK,
    ScriptedGenerator,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.envs.base import EnvStart
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task
from toolgrpo.tools.schema import function_tool
from toolgrpo.tools.types import ToolCall

pytest.importorskip("mcp")
pytest.importorskip("openenv.core.env_server.mcp_types")

from toolgrpo.envs.mcp import MCPEnv, MCPOptions  # noqa: E402
from toolgrpo.envs.openenv import OpenEnvEnv, OpenEnvOptions  # noqa: E402

ANSWER = "<answer>5</answer>"
SPEC = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "a+b",
        "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
    },
}


class SlowMCPClient:
    async def call_tool(self, name, arguments):
        await asyncio.sleep(3600)


class SlowOpenEnvClient:
    async def step(self, action):
        await asyncio.sleep(3600)


class ServerSaysTimeout:
    """An OpenEnv server whose own deadline stopped the tool."""

    async def step(self, action):
        error = SimpleNamespace(error_type="timeout", message="tool ran past 5s")
        return SimpleNamespace(
            reward=None, done=False, observation=SimpleNamespace(error=error, result=None)
        )


def _connected(env, client):
    """``env`` as after a successful reset against a server that offers ``add``."""

    async def reset():
        env._client, env._tools = client, {"add"}
        return EnvStart([{"role": "user", "content": "what is 2+3?"}], [SPEC])

    env.reset = reset
    return env


def _mcp(client=None):
    return _connected(MCPEnv(TASK, MCPOptions(command=("unused",), timeout_s=0.2)), client)


def _openenv(client=None):
    return _connected(OpenEnvEnv(TASK, OpenEnvOptions("http://unused", timeout_s=0.2)), client)


def _slow_tool_env():
    def add(a: int, b: int) -> int:
        """Add, slowly.

        Args:
            a: first
            b: second
        """
        time.sleep(2)
        return a + b

    env = ToolEnv([{"role": "user", "content": "what is 2+3?"}], [function_tool(add)], lambda t: 1)
    env.timeout_s = 0.2
    return env


CASES = {
    "mcp": (lambda: _mcp(SlowMCPClient()), "mcp tool 'add' timed out after 0.2s"),
    "openenv": (lambda: _openenv(SlowOpenEnvClient()), "openenv step timed out after 0.2s"),
    "openenv_server": (
        lambda: _openenv(ServerSaysTimeout()),
        "openenv tool 'add' timed out: tool ran past 5s",
    ),
    "in_process": (_slow_tool_env, "tool call timed out (tool 'add' timed out after 0.2s)"),
}


@pytest.mark.parametrize("kind", ["mcp", "openenv", "openenv_server"])
def test_mcp_and_openenv_agree_a_timeout_is_the_environments_failure(kind):
    make, reason = CASES[kind]
    env = make()

    async def run():
        await env.reset()
        return await env.step([ToolCall("add", {"a": 2, "b": 3}, id="c0")])

    (result,) = asyncio.run(run())
    assert result.is_error and result.error_type == "timeout"
    assert env.fatal_error == reason


@pytest.mark.parametrize("kind", list(CASES))
def test_a_timed_out_call_fails_the_episode_whatever_the_environment(tok, kind):  # noqa: F811
    make, reason = CASES[kind]
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_response_length=400)
    ep = asyncio.run(play_task(TASK, make(), batcher, tok, limits, uid="u"))
    batcher.close()
    assert ep.stop_reason == "env_error" and ep.env_failure == reason
    assert ep.tool_error_types == {"timeout": 1} and ep.num_turns == 1

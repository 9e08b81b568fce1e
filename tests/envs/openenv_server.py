"""A small OpenEnv environment server for the ``openenv`` environment's tests (127.0.0.1 only):
``add`` answers, ``submit`` ends the episode with reward 1 for the right answer. OpenEnv's
default session limit (``max_concurrent_envs`` 1) unless a second argument gives one; with
``text`` instead, an echo environment whose actions are text, not MCP tool calls."""

from __future__ import annotations

import sys

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State


class AddEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session its own instance (for a raised limit)

    def __init__(self) -> None:
        mcp = FastMCP("add-env")

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool()
        def submit(answer: int) -> str:
            """Submit the final answer."""
            return "submitted"

        super().__init__(mcp)
        self._state = State(episode_id="e", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        self._state = State(episode_id=episode_id or "e", step_count=0)
        return Observation(done=False, reward=0.0)

    def _score(self, action, obs):
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            obs.done = True
            obs.reward = 1.0 if action.arguments.get("answer") == 5 else 0.0
        return obs

    def step(self, action, timeout_s=None, **kwargs):
        return self._score(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action, timeout_s=None, **kwargs):
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        return self._score(action, obs)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"error": "unsupported"})

    @property
    def state(self) -> State:
        return self._state


class TextAction(Action):
    message: str


class TextObservation(Observation):
    echoed: str = ""


class EchoEnv(Environment):
    """Text in, text out: no MCP tools."""

    def reset(self, seed=None, episode_id=None, **kwargs) -> TextObservation:
        return TextObservation(done=False, reward=0.0)

    def step(self, action, timeout_s=None, **kwargs) -> TextObservation:
        return TextObservation(echoed=action.message, done=False, reward=0.0)

    @property
    def state(self) -> State:
        return State(episode_id="e", step_count=0)


if __name__ == "__main__":
    if sys.argv[2:] == ["text"]:
        app = create_app(EchoEnv, TextAction, TextObservation, env_name="echo")
    else:
        cap = int(sys.argv[2]) if len(sys.argv) > 2 else None
        app = create_app(
            AddEnv, CallToolAction, CallToolObservation, env_name="add_env", max_concurrent_envs=cap
        )
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

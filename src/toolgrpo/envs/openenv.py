"""OpenEnv environment servers as environments (``openenv-core``'s client, extra
``toolgrpo[openenv]``): environments written for TRL or torchforge train here unchanged.

Config::

    my_env: {type: openenv, url: "http://127.0.0.1:8000", max_turns: 6}

One session per episode: ``reset`` on the server, its tools (``ListToolsAction``) as the episode's
tool specs, each model tool call a ``CallToolAction`` step (one action per step, in call order).
Step rewards are summed as the episode's reward (``reward: answer`` scores the final ``<answer>``
against the ground truth instead); a step with ``done`` ends the episode after that turn. Tool
errors the server reports are error results for the model; a server that cannot be reached or
drops the session is the environment's failure (left out of training), and so is a timeout, ours
(``timeout_s``) or one the server reports (the one timeout rule, as for MCP and every other
environment type: the episode loop ends the episode on any ``timeout`` result). OpenEnv sessions
cannot be copied, so tool rollback is refused at startup.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from toolgrpo.data.task import Task
from toolgrpo.envs._tool_server import refuse_before_sending
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.calculator import with_system
from toolgrpo.envs.direct import direct_reward
from toolgrpo.envs.mcp import SYSTEM_PROMPT
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.tools.types import ToolCall, ToolResult

OPTIONS = ("url", "timeout_s", "connect_timeout_s", "reward", "system_prompt")
# OpenEnv's ToolErrorType values → ours (anything else: the tool failed, "exception").
_ERRORS = {
    "tool_not_found": "unknown_tool",
    "invalid_args": "invalid_arguments",
    "timeout": "timeout",
    "transport_error": "transport",
}


@dataclass(frozen=True)
class OpenEnvOptions:
    url: str
    timeout_s: float = 60.0  # per step
    connect_timeout_s: float = 10.0
    reward: str = "env"  # env: the sum of step rewards | answer: final <answer> vs ground truth
    system_prompt: str = SYSTEM_PROMPT

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> OpenEnvOptions:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise EnvConfigError(f"openenv env: unknown option(s) {unknown}; known: {OPTIONS}")
        url = str(options.get("url") or "")
        if urlsplit(url).scheme not in ("http", "https", "ws", "wss"):
            raise EnvConfigError(f"openenv env: option url must be http://host:port, got {url!r}")
        try:
            out = cls(
                url,
                float(options.get("timeout_s", cls.timeout_s)),
                float(options.get("connect_timeout_s", cls.connect_timeout_s)),
                str(options.get("reward", "env")),
                str(options.get("system_prompt", SYSTEM_PROMPT)),
            )
        except (TypeError, ValueError) as e:
            raise EnvConfigError(f"openenv env: bad option: {e}") from e
        if out.reward not in ("env", "answer"):
            raise EnvConfigError(f"openenv env: reward must be env or answer, got {out.reward!r}")
        if out.timeout_s <= 0 or out.connect_timeout_s <= 0:
            raise EnvConfigError("openenv env: timeouts must be > 0")
        return out


def _text(value: Any) -> str:
    """A step's tool result as text: an MCP result (object or its JSON form) by its text parts or
    data, anything else as JSON."""
    if isinstance(value, str):
        return value
    get = value.get if isinstance(value, dict) else lambda k: getattr(value, k, None)
    content = get("content")
    if isinstance(content, list) and content:
        texts = [
            c.get("text") if isinstance(c, dict) else getattr(c, "text", None) for c in content
        ]
        if all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    for key in ("data", "structured_content"):
        if get(key) is not None:
            return _text(get(key))
    return json.dumps(value, default=str)


class OpenEnvEnv(Env):
    supports_snapshot = False  # a server session cannot be copied: rollback is refused

    def __init__(self, task: Task, options: OpenEnvOptions) -> None:
        self.task = task
        self.options = options
        self.fatal_error: str | None = None
        self.env_reward = 0.0
        self._client: Any = None
        self._tools: set[str] = set()

    async def reset(self) -> EnvStart:
        messages = with_system(self.task.messages, self.options.system_prompt)
        try:
            from openenv.core.mcp_client import MCPToolClient

            o = self.options
            self._client = MCPToolClient(
                base_url=o.url, connect_timeout_s=o.connect_timeout_s, message_timeout_s=o.timeout_s
            )
            await asyncio.wait_for(self._client.connect(), o.connect_timeout_s)
            await asyncio.wait_for(self._client.reset(), o.timeout_s)
            tools = await asyncio.wait_for(self._client.list_tools(use_cache=False), o.timeout_s)
        except Exception as exc:  # unreachable, refused, timed out: the environment's failure
            self.fatal_error = f"openenv server unavailable: {type(exc).__name__}: {exc}"
            return EnvStart(messages, [])
        specs = []
        for t in tools:
            self._tools.add(t.name)
            params = t.input_schema or {"type": "object", "properties": {}}
            fn = {"name": t.name, "description": t.description or "", "parameters": params}
            specs.append({"type": "function", "function": fn})
        return EnvStart(messages, specs)

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        out = []
        for call in calls:  # OpenEnv steps one action at a time
            res = await self._call(call)
            out.append(res)
            if res.done:
                break
        return out

    async def _call(self, call: ToolCall) -> ToolResult:
        def error(kind: str, text: str) -> ToolResult:
            return ToolResult(text, True, kind, call.name, call.id)

        refused = refuse_before_sending(
            call, self._tools, self.fatal_error, self._client is not None, "environment"
        )
        if refused is not None:
            return refused
        from openenv.core.env_server.mcp_types import CallToolAction

        action = CallToolAction(tool_name=call.name, arguments=dict(call.arguments))
        try:
            step = await asyncio.wait_for(self._client.step(action), self.options.timeout_s)
        except TimeoutError:
            self.fatal_error = f"openenv step timed out after {self.options.timeout_s}s"
            return error("timeout", f"Error: tool '{call.name}' timed out")
        except Exception as exc:  # the session broke
            self.fatal_error = f"openenv step failed: {type(exc).__name__}: {exc}"
            return error("transport", f"Error: the environment failed ({type(exc).__name__})")
        if step.reward is not None:
            self.env_reward += float(step.reward)
        obs = step.observation
        err = getattr(obs, "error", None)
        if err is not None:
            kind = _ERRORS.get(str(getattr(err.error_type, "value", err.error_type)), "exception")
            res = error(kind, f"Error: {err.message}")
            if kind == "timeout":  # the server's own deadline: the environment's failure too
                self.fatal_error = f"openenv tool '{call.name}' timed out: {err.message}"
        else:
            res = ToolResult(_text(getattr(obs, "result", "")), name=call.name, call_id=call.id)
        if step.done:
            res = ToolResult(
                res.text, res.is_error, res.error_type, res.name, res.call_id, done=True
            )
        return res

    async def reward(self, transcript: Transcript) -> EnvReward:
        if self.options.reward == "answer":
            return direct_reward(transcript, self.task.ground_truth)
        return EnvReward(self.env_reward, {"env": self.env_reward})

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), self.options.connect_timeout_s)
            except Exception:  # closing is best effort
                pass


@register_env("openenv")
def make_openenv_env(task: Task, options: Mapping[str, Any]) -> OpenEnvEnv:
    return OpenEnvEnv(task, OpenEnvOptions.parse(options))

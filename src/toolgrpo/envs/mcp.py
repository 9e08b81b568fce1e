"""Tools from an MCP server (the official ``mcp`` SDK, extra ``toolgrpo[mcp]``).

Config (a task type whose tools live on an MCP server)::

    my_tools: {type: mcp, command: [python, -m, my_server], max_turns: 4}      # stdio: started
    my_tools: {type: mcp, url: "http://127.0.0.1:8000/mcp", max_turns: 4}      # streamable HTTP

Each episode opens its own session (a stdio server is started per episode and stopped at close),
lists the server's tools as the episode's tool specs and runs the model's calls as ``tools/call``.
MCP has no reward: by default the final ``<answer>`` is scored against the task's ground truth
(as the ``direct`` environment does); ``reward: "module:function"`` names a function of the
``Transcript`` and the task. A server that cannot be reached, dies, or lets a call run past
``timeout_s`` sets ``fatal_error``: the episode ends as an environment failure (left out of
training), never as the model's fault (the one timeout rule, as for OpenEnv and every other
environment type). MCP servers keep state the trainer cannot copy, so tool rollback is refused at
startup.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from toolgrpo.data.task import Task
from toolgrpo.envs._tool_server import refuse_before_sending
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript, off_loop
from toolgrpo.envs.calculator import with_system
from toolgrpo.envs.direct import direct_reward
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import _as_reward
from toolgrpo.tools.types import ToolCall, ToolResult

OPTIONS = ("command", "url", "env", "timeout_s", "connect_timeout_s", "reward", "system_prompt")
SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Call them as needed, then give the final answer "
    "as <answer>ANSWER</answer>."
)


@dataclass(frozen=True)
class MCPOptions:
    command: tuple[str, ...] = ()  # stdio: the server's command line
    url: str = ""  # streamable HTTP: http(s)://host:port/mcp
    env: dict[str, str] = field(default_factory=dict)  # extra variables for a stdio server
    timeout_s: float = 30.0  # per tool call
    connect_timeout_s: float = 30.0  # start/connect, initialise and list tools
    reward: str = ""  # "module:function" (transcript, task) -> float | EnvReward; "" = <answer>
    system_prompt: str = SYSTEM_PROMPT

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> MCPOptions:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise EnvConfigError(f"mcp env: unknown option(s) {unknown}; known: {list(OPTIONS)}")
        cmd = options.get("command") or ()
        cmd = tuple(cmd.split() if isinstance(cmd, str) else (str(c) for c in cmd))
        url = str(options.get("url") or "")
        if bool(cmd) == bool(url):
            raise EnvConfigError("mcp env: give exactly one of command (stdio) or url (HTTP)")
        if url and urlsplit(url).scheme not in ("http", "https"):
            raise EnvConfigError(f"mcp env: url must be http(s)://host:port/mcp, got {url!r}")
        try:
            out = cls(
                cmd,
                url,
                {str(k): str(v) for k, v in dict(options.get("env") or {}).items()},
                float(options.get("timeout_s", cls.timeout_s)),
                float(options.get("connect_timeout_s", cls.connect_timeout_s)),
                str(options.get("reward") or ""),
                str(options.get("system_prompt", SYSTEM_PROMPT)),
            )
        except (TypeError, ValueError) as e:
            raise EnvConfigError(f"mcp env: bad option: {e}") from e
        if out.timeout_s <= 0 or out.connect_timeout_s <= 0:
            raise EnvConfigError("mcp env: timeouts must be > 0")
        if out.reward:
            load_reward(out.reward)  # fail at startup, not mid-run
        return out


def load_reward(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise EnvConfigError(f"mcp env: reward {spec!r} is not module:function ({e})") from e
    if not callable(fn):
        raise EnvConfigError(f"mcp env: reward {spec!r} is not callable")
    return fn


def result_text(result: Any) -> str:
    """An MCP tool result as the text the model reads: text parts joined, else structured JSON."""
    parts = []
    for c in getattr(result, "content", None) or []:
        text = getattr(c, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(c, 'type', 'content')}]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, default=str))
    return "\n".join(parts)


class MCPEnv(Env):
    supports_snapshot = False  # the server's state cannot be copied: rollback is refused

    def __init__(self, task: Task, options: MCPOptions) -> None:
        self.task = task
        self.options = options
        self.fatal_error: str | None = None
        self._stack: AsyncExitStack | None = None
        self._client: Any = None
        self._tools: set[str] = set()

    def _server(self) -> Any:
        if self.options.url:
            return self.options.url
        from mcp import StdioServerParameters

        cmd = self.options.command
        return StdioServerParameters(command=cmd[0], args=list(cmd[1:]), env=self.options.env)

    async def reset(self) -> EnvStart:
        messages = with_system(self.task.messages, self.options.system_prompt)
        try:
            from mcp import Client

            self._stack = AsyncExitStack()
            client = Client(self._server(), read_timeout_seconds=self.options.timeout_s)
            self._client = await asyncio.wait_for(
                self._stack.enter_async_context(client), self.options.connect_timeout_s
            )
            listed = await asyncio.wait_for(
                self._client.list_tools(), self.options.connect_timeout_s
            )
        except Exception as exc:  # unreachable, failed to start, timed out: the env's failure
            self.fatal_error = f"mcp server unavailable: {type(exc).__name__}: {exc}"
            return EnvStart(messages, [])
        specs = []
        for t in listed.tools:
            self._tools.add(t.name)
            params = t.input_schema or {"type": "object", "properties": {}}
            fn = {"name": t.name, "description": t.description or "", "parameters": params}
            specs.append({"type": "function", "function": fn})
        return EnvStart(messages, specs)

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self._call(c) for c in calls)))

    async def _call(self, call: ToolCall) -> ToolResult:
        def error(kind: str, text: str) -> ToolResult:
            return ToolResult(text, True, kind, call.name, call.id)

        refused = refuse_before_sending(
            call, self._tools, self.fatal_error, self._client is not None, "tool server"
        )
        if refused is not None:
            return refused
        try:
            res = await asyncio.wait_for(
                self._client.call_tool(call.name, dict(call.arguments)), self.options.timeout_s
            )
        except TimeoutError:  # the environment's failure, not the model's (one rule for all)
            self.fatal_error = f"mcp tool '{call.name}' timed out after {self.options.timeout_s:g}s"
            return error("timeout", f"Error: tool '{call.name}' timed out")
        except Exception as exc:  # the session broke: every later call fails too
            self.fatal_error = f"mcp call failed: {type(exc).__name__}: {exc}"
            return error("transport", f"Error: the tool server failed ({type(exc).__name__})")
        text = result_text(res)
        if getattr(res, "is_error", False):  # the tool said error (bad arguments, it raised)
            return error("exception", text or f"Error: tool '{call.name}' failed")
        return ToolResult(text, name=call.name, call_id=call.id)

    async def reward(self, transcript: Transcript) -> EnvReward:
        if not self.options.reward:
            return direct_reward(transcript, self.task.ground_truth)
        fn = load_reward(self.options.reward)  # a sync one runs in a thread: it cannot block
        return _as_reward(await off_loop(fn, transcript, self.task))

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            try:
                await asyncio.wait_for(stack.aclose(), self.options.connect_timeout_s)
            except Exception:  # closing is best effort (a dead server, a stuck subprocess)
                pass


@register_env("mcp")
def make_mcp_env(task: Task, options: Mapping[str, Any]) -> MCPEnv:
    return MCPEnv(task, MCPOptions.parse(options))

"""Tools from an MCP server (the official ``mcp`` SDK, extra ``toolgrpo[mcp]``).

Config (a task type whose tools live on an MCP server)::

    my_tools: {type: mcp, command: [python, -m, my_server], max_turns: 4}      # stdio: started
    my_tools: {type: mcp, url: "http://127.0.0.1:8000/mcp", max_turns: 4}      # streamable HTTP

Each episode has a session of its own; it lists the server's tools as the episode's tool specs and
runs the model's calls as ``tools/call``. A stdio server that offers a ``reset`` tool (the
``reset_tool`` option) is pooled: kept after its episode and reset before the next one instead of
started again (``envs/pool.py``; ``pool_sessions: false`` starts one per episode, as a server
without the tool is). MCP has no reward: by default the final ``<answer>`` is scored against the
task's ground truth (as the ``direct`` environment does); ``reward: "module:function"`` names a
function of the ``Transcript`` and the task. A server that cannot be reached, dies, or lets a call
run past ``timeout_s`` sets ``fatal_error``: the episode ends as an environment failure (left out
of training; its server is stopped, never reused), never as the model's fault (the one timeout
rule, as for OpenEnv and every other environment type). MCP servers keep state the trainer cannot
copy, so tool rollback is refused at startup. A stdio task type plays at most 32 episodes at once
unless its ``max_concurrency`` says otherwise (null: no cap).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from toolgrpo.data.task import Task
from toolgrpo.envs._tool_server import refuse_before_sending
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript, off_loop
from toolgrpo.envs.calculator import with_system
from toolgrpo.envs.direct import direct_reward
from toolgrpo.envs.pool import MCPSession, ServerKey, SessionPool, on_pool_loop, session_pool
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import _as_reward
from toolgrpo.tools.types import ToolCall, ToolResult

OPTIONS = (
    "command",
    "url",
    "env",
    "timeout_s",
    "connect_timeout_s",
    "reward",
    "system_prompt",
    "pool_sessions",
    "reset_tool",
)
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
    pool_sessions: bool = True  # stdio: reuse a server that offers reset_tool across episodes
    reset_tool: str = "reset"  # the server's tool that resets it between episodes (hidden)

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
                _flag(options.get("pool_sessions", True)),
                str(options.get("reset_tool") or "reset"),
            )
        except (TypeError, ValueError) as e:
            raise EnvConfigError(f"mcp env: bad option: {e}") from e
        if out.timeout_s <= 0 or out.connect_timeout_s <= 0:
            raise EnvConfigError("mcp env: timeouts must be > 0")
        if out.reward:
            load_reward(out.reward)  # fail at startup, not mid-run
        return out


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"pool_sessions must be true or false, got {value!r}")
    return value


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
        self._pool: SessionPool | None = None
        self._session: MCPSession | None = None
        self._client: Any = None  # what calls go to: the session, through the pool's loop
        self._tools: set[str] = set()
        self._abandoned = False  # a call was cancelled mid-flight: the server may still run it

    def _pool_for(self) -> SessionPool:
        o = self.options
        if o.url:  # HTTP: the server keys state by session; one session per episode
            key = ServerKey(o.url, (), o.timeout_s, "")
            return session_pool(key, o.url, o.connect_timeout_s, reuse=False)
        from mcp import StdioServerParameters

        reset = o.reset_tool if o.pool_sessions else ""
        key = ServerKey(o.command, tuple(sorted(o.env.items())), o.timeout_s, reset)
        params = StdioServerParameters(command=o.command[0], args=list(o.command[1:]), env=o.env)
        return session_pool(key, params, o.connect_timeout_s, reuse=o.pool_sessions)

    async def reset(self) -> EnvStart:
        messages = with_system(self.task.messages, self.options.system_prompt)
        try:
            self._pool = self._pool_for()
            self._session = await on_pool_loop(self._pool.acquire())
        except Exception as exc:  # unreachable, failed to start, timed out: the env's failure
            self.fatal_error = f"mcp server unavailable: {type(exc).__name__}: {exc}"
            return EnvStart(messages, [])
        self._client = _OnPoolLoop(self._session)
        specs = []
        hidden = self._session.key.reset_tool
        for t in self._session.tools:
            if t.name == hidden and self._session.resettable:
                continue  # the pool's, not the model's
            self._tools.add(t.name)
            params = t.input_schema or {"type": "object", "properties": {}}
            fn = {"name": t.name, "description": t.description or "", "parameters": params}
            specs.append({"type": "function", "function": fn})
        return EnvStart(messages, specs)

    def opening_for(self, task: Task, start: EnvStart) -> EnvStart:
        """Every task of this type opens with the same system prompt and the server's tools."""
        return EnvStart(with_system(task.messages, self.options.system_prompt), start.tools)

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
        except asyncio.CancelledError:  # the episode's deadline: never hand this server on
            self._abandoned = True
            raise
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
        """The session goes back to its pool, which keeps it only if the episode ended without
        an environment failure (and the server can be reset); otherwise it is stopped."""
        pool, session, self._session, self._client = self._pool, self._session, None, None
        if pool is not None and session is not None:
            healthy = self.fatal_error is None and not self._abandoned
            try:
                await asyncio.wait_for(
                    on_pool_loop(pool.release(session, healthy)),
                    self.options.connect_timeout_s,
                )
            except Exception:  # closing is best effort (a dead server, a stuck subprocess)
                pass


class _OnPoolLoop:
    """A session's ``call_tool`` for an episode on another event loop."""

    def __init__(self, session: MCPSession) -> None:
        self.session = session

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await on_pool_loop(self.session.call_tool(name, arguments))


@register_env("mcp")
def make_mcp_env(task: Task, options: Mapping[str, Any]) -> MCPEnv:
    return MCPEnv(task, MCPOptions.parse(options))


# Episodes of a stdio type open at once unless ``max_concurrency`` says otherwise: 128 servers
# starting together missed the reset deadline in 14 % of episodes; 32 at a time, in none.
STDIO_MAX_CONCURRENCY = 32


def default_max_concurrency(options: Mapping[str, Any]) -> int | None:
    """The registry's cap for an MCP task type with no ``max_concurrency``: stdio servers are
    processes started per episode (or pooled); an HTTP server is the user's to size."""
    return STDIO_MAX_CONCURRENCY if options.get("command") else None


make_mcp_env.default_max_concurrency = default_max_concurrency  # type: ignore[attr-defined]

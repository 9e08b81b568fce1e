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

A server at its session limit (OpenEnv's default ``max_concurrent_envs`` is 1) answers
``CAPACITY_REACHED``: the episode waits and tries again, with backoff, woken early when one of
this process's sessions on that server closes, for up to ``capacity_wait_s`` before failing in the
environment. A server whose actions are not MCP tool calls (a text action/observation environment)
is refused with a reason that says what is missing.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
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

OPTIONS = ("url", "timeout_s", "connect_timeout_s", "reward", "system_prompt", "capacity_wait_s")
_BACKOFF_S = (0.05, 1.0)  # first and longest wait between tries at a full server
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
    # How long a reset waits for a full server (CAPACITY_REACHED); below the episode loop's
    # 60 s reset deadline, so the failure names the server's session limit.
    capacity_wait_s: float = 45.0

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
                float(options.get("capacity_wait_s", cls.capacity_wait_s)),
            )
        except (TypeError, ValueError) as e:
            raise EnvConfigError(f"openenv env: bad option: {e}") from e
        if out.reward not in ("env", "answer"):
            raise EnvConfigError(f"openenv env: reward must be env or answer, got {out.reward!r}")
        if out.timeout_s <= 0 or out.connect_timeout_s <= 0:
            raise EnvConfigError("openenv env: timeouts must be > 0")
        if out.capacity_wait_s < 0:
            raise EnvConfigError("openenv env: capacity_wait_s must be >= 0")
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
            self._client = await self._open()
            tools = await _list_tools(self._client, self.options)
        except NotToolEnv as exc:  # not an environment this adapter can play
            self.fatal_error = f"openenv environment refused: {exc}"
            return EnvStart(messages, [])
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

    async def _open(self) -> Any:
        """A reset session; a full server (``CAPACITY_REACHED``) is tried again with backoff
        until ``capacity_wait_s`` has passed."""
        from openenv.core.mcp_client import MCPToolClient

        o = self.options
        give_up = time.monotonic() + o.capacity_wait_s
        wait = _BACKOFF_S[0]
        while True:
            # Held by the environment while it opens: an episode cancelled meanwhile (its
            # deadline) still closes it, so a one-session server is not left full.
            self._client = client = MCPToolClient(
                base_url=o.url, connect_timeout_s=o.connect_timeout_s, message_timeout_s=o.timeout_s
            )
            try:
                await asyncio.wait_for(client.connect(), o.connect_timeout_s)
                await asyncio.wait_for(client.reset(), o.timeout_s)
                return client
            except Exception as exc:
                full = await _at_capacity(client, exc)
                self._client = None
                await _quietly_close(client, o.connect_timeout_s)
                left = give_up - time.monotonic()
                if not full:
                    raise
                if left <= 0:
                    raise RuntimeError(
                        f"{o.url} stayed at its session limit for {o.capacity_wait_s:g}s "
                        f"(capacity_wait_s): raise the server's max_concurrent_envs or set "
                        f"this task type's max_concurrency ({exc})"
                    ) from exc
                await _vacancy(o.url, min(wait * random.uniform(0.5, 1.5), left))
                wait = min(2 * wait, _BACKOFF_S[1])

    def opening_for(self, task: Task, start: EnvStart) -> EnvStart:
        """Every task of this type opens with the same system prompt and the server's tools."""
        return EnvStart(with_system(task.messages, self.options.system_prompt), start.tools)

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
            await _quietly_close(client, self.options.connect_timeout_s)
            _vacated(self.options.url)


class NotToolEnv(RuntimeError):
    """The server's environment takes no MCP tool actions."""


async def _list_tools(client: Any, o: OpenEnvOptions) -> list[Any]:
    """The server's tools, or ``NotToolEnv`` when its actions are not MCP tool calls (a text
    action/observation environment, which this adapter cannot play)."""
    from openenv.core.env_server.mcp_types import ListToolsAction, ListToolsObservation

    try:
        step = await asyncio.wait_for(client.step(ListToolsAction()), o.timeout_s)
    except RuntimeError as exc:
        if "VALIDATION_ERROR" not in str(exc) and "Invalid message" not in str(exc):
            raise
        step = None
    if step is None or not isinstance(step.observation, ListToolsObservation):
        raise NotToolEnv(
            f"the environment at {o.url} does not answer ListToolsAction with its tools: its "
            "actions are not MCP tool calls. The openenv type plays MCP environments "
            "(ListToolsAction/CallToolAction, openenv's MCPEnvironment); serve a text "
            "action/observation environment behind an MCPEnvironment whose tool takes the "
            "action, or write an Env for it (docs/multi_turn.md, 'OpenEnv environments')"
        )
    return list(step.observation.tools)


async def _at_capacity(client: Any, exc: Exception) -> bool:
    """Whether the server refused the session for its session limit. It says so in a message
    sent as it closes the socket, so a reset that found the socket closed reads it from there."""
    if "CAPACITY_REACHED" in str(exc):
        return True
    ws = getattr(client, "_ws", None)  # the client only raises ConnectionClosed here
    if ws is None:
        return False
    try:
        raw = await asyncio.wait_for(ws.recv(), 1.0)
        return json.loads(raw).get("data", {}).get("code") == "CAPACITY_REACHED"
    except Exception:
        return False


async def _quietly_close(client: Any, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(client.close(), timeout_s)
    except Exception:  # closing is best effort
        pass


# Episodes of this event loop waiting for a session on a full server, by URL (first come, first
# woken): a session that closes wakes one of them at once instead of at its next backoff.
_WAITERS: dict[tuple[int, str], collections.deque[asyncio.Future[None]]] = {}


async def _vacancy(url: str, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue = _WAITERS.setdefault((id(loop), url), collections.deque())
    woken: asyncio.Future[None] = loop.create_future()
    queue.append(woken)
    try:
        await asyncio.wait_for(woken, timeout_s)
    except TimeoutError:
        pass
    finally:
        if woken in queue:
            queue.remove(woken)
        if not queue:
            _WAITERS.pop((id(loop), url), None)


def _vacated(url: str) -> None:
    queue = _WAITERS.get((id(asyncio.get_running_loop()), url))
    while queue:
        woken = queue.popleft()
        if not woken.done():
            woken.set_result(None)
            return


@register_env("openenv")
def make_openenv_env(task: Task, options: Mapping[str, Any]) -> OpenEnvEnv:
    return OpenEnvEnv(task, OpenEnvOptions.parse(options))

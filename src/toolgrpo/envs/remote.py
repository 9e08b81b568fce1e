"""An environment that lives in another process: ``toolgrpo serve-env`` on the far side.

Config (one task type pointed at a server)::

    my_remote: {type: remote, url: "ws://127.0.0.1:8900/ws", token_env: MY_TOKEN, max_turns: 6}

The token comes from ``token_env`` (a variable's name) or ``token_file`` (a path); a literal
``token`` works but is redacted from ``config.yaml`` and checkpoints. The task's ground truth is
sent with the reward request, not at reset, unless the server says its environment needs it then.

A lost server must not stop training: any transport failure (refused, dropped, timed out, garbled),
or the served environment raising, sets ``fatal_error`` and tool calls get ``transport`` error
results; the episode loop then ends the episode as an environment failure, which the trainer leaves
out of training. Nothing raises out of ``reset``/``step``/``reward``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.remote_openings import request_openings
from toolgrpo.envs.wire import (
    GROUND_TRUTH_HEADER,
    WireError,
    call_to_dict,
    is_loopback,
    result_from_dict,
    reward_from_dict,
    start_from_dict,
    task_to_dict,
    transcript_to_dict,
)
from toolgrpo.tools.types import ToolCall, ToolResult


@dataclass(frozen=True)
class RemoteOptions:
    url: str  # ws://host:port/ws
    token: str | None = None  # or from option ``token_env`` (a variable) / ``token_file`` (a path)
    timeout_s: float = 60.0  # per request/reply
    connect_timeout_s: float = 10.0
    error_reward: float = -1.0  # the score of an episode whose server failed
    max_message_bytes: int = 16 * 1024 * 1024

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> RemoteOptions:
        opts = dict(options)
        token_env = opts.pop("token_env", None)
        token_file = opts.pop("token_file", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(opts) - known)
        if unknown:
            known_all = sorted(known | {"token_env", "token_file"})
            raise EnvConfigError(f"remote env: unknown option(s) {unknown}; known: {known_all}")
        url = str(opts.get("url") or "")
        if urlsplit(url).scheme not in ("ws", "wss"):
            raise EnvConfigError(f"remote env: option url must be ws://host:port/ws, got {url!r}")
        if sum(bool(x) for x in (opts.get("token"), token_env, token_file)) > 1:
            raise EnvConfigError("remote env: give one of token, token_env, token_file")
        if token_env:
            if not os.environ.get(str(token_env)):
                raise EnvConfigError(f"remote env: token_env {token_env!r} is not set")
            opts["token"] = os.environ[str(token_env)]
        if token_file:
            opts["token"] = _read_token_file(str(token_file))
        try:
            out = cls(
                url=url,
                token=str(opts["token"]) if opts.get("token") else None,
                timeout_s=float(opts.get("timeout_s", cls.timeout_s)),
                connect_timeout_s=float(opts.get("connect_timeout_s", cls.connect_timeout_s)),
                error_reward=float(opts.get("error_reward", cls.error_reward)),
                max_message_bytes=int(opts.get("max_message_bytes", cls.max_message_bytes)),
            )
        except (TypeError, ValueError) as e:
            raise EnvConfigError(f"remote env: bad option: {e}") from e
        if out.timeout_s <= 0 or out.connect_timeout_s <= 0:
            raise EnvConfigError("remote env: timeouts must be > 0")
        return out


_ANSWER_META = ("output_sft",)  # Task.meta keys that hold a reference answer (data/loader.py)


def _read_token_file(path: str) -> str:
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise EnvConfigError(f"remote env: cannot read token_file {path}: {e}") from e
    if not token:
        raise EnvConfigError(f"remote env: token_file {path} is empty")
    return token


class RemoteEnv(Env):
    """Proxies one episode to a server session; ``max_turns`` stays the router's (from config)."""

    snapshot_known_at_reset = True
    reward_range = None  # the server's reward is unknown here (and error_reward may be anything)

    def __init__(self, task: Task, options: RemoteOptions) -> None:
        self.task = task
        self.options = options
        self.fatal_error: str | None = None
        self.supports_snapshot = False  # learnt from the server at reset
        self.server_max_turns: int | None = None  # the served env's own value, for information
        self._ws: ClientConnection | None = None
        self._lock = asyncio.Lock()
        self._ground_truth_sent = False  # at reset, when the server's env needs it then

    # ---- episode ------------------------------------------------------------------------------
    async def reset(self) -> EnvStart:
        """On failure: ``fatal_error`` set and the task's own messages, so the loop can end it."""
        fallback = EnvStart(
            [dict(m) for m in self.task.messages], [dict(t) for t in self.task.tools]
        )
        if self._ws is not None or self.fatal_error is not None:
            await self._fail("reset called twice on one remote episode")
            return fallback
        if not await self._connect():
            return fallback
        msg = {"op": "reset", "task": self._wire_task(self.task)}
        reply = await self._request(msg, "start")
        if reply is None:
            return fallback
        if reply["op"] == "error":
            await self._fail(f"server could not start the episode: {reply.get('message')}")
            return fallback
        try:
            start = start_from_dict(reply)
        except WireError as e:
            await self._fail(f"bad reply to reset: {e}")
            return fallback
        max_turns = reply.get("max_turns")
        self.server_max_turns = max_turns if isinstance(max_turns, int) else None
        self.single_turn = bool(reply.get("single_turn", False))
        self.supports_snapshot = bool(reply.get("snapshot", False))
        return start

    async def openings_for(self, tasks: Sequence[Task]) -> list[EnvStart | None] | None:
        """The server's openings for ``tasks`` over one session of their own (closed after),
        ``None`` from a server without the ``openings`` op; a failed server leaves them all
        ``None`` (and ``fatal_error`` set). The episode itself is not started."""
        if self._ws is not None or self.fatal_error is not None:
            return None
        if not await self._connect():
            return [None] * len(tasks)
        try:
            wire = [self._wire_task(t) for t in tasks]
            o = self.options
            return await request_openings(self._request, wire, o.timeout_s, o.max_message_bytes)
        finally:
            await self.close()

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        if not calls:
            return []
        reply = await self._request(
            {"op": "step", "calls": [call_to_dict(c) for c in calls]}, "results"
        )
        if reply is None:
            return [self._transport_result(c) for c in calls]
        if reply["op"] == "error":  # the served env's step raised: its failure, as in process
            await self._fail(f"server env step failed: {reply.get('message')}")
            return [self._transport_result(c) for c in calls]
        try:
            raw = reply.get("results")
            if not isinstance(raw, list) or len(raw) != len(calls):
                raise WireError(f"expected {len(calls)} results, got {raw!r:.200}")
            results = [result_from_dict(r) for r in raw]
        except WireError as e:
            await self._fail(f"bad reply to step: {e}")
            return [self._transport_result(c) for c in calls]
        if reply.get("fatal_error"):
            self.fatal_error = f"server env: {reply['fatal_error']}"
        return results

    async def next_user_turn(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        reply = await self._request({"op": "next_user", "messages": messages}, "user")
        if reply is None:
            return None
        out = reply.get("messages")
        if reply["op"] == "error" or not (out is None or isinstance(out, list)):
            await self._fail(f"bad reply to next_user: {reply.get('message', reply)!r:.200}")
            return None
        return out

    async def reward(self, transcript: Transcript) -> EnvReward:
        msg: dict[str, Any] = {"op": "reward", "transcript": transcript_to_dict(transcript)}
        if not self._ground_truth_sent:
            msg["ground_truth"] = self.task.ground_truth
        reply = await self._request(msg, "reward")
        if reply is not None and reply["op"] == "reward":
            try:
                return reward_from_dict(reply)
            except WireError as e:
                await self._fail(f"bad reply to reward: {e}")
        elif reply is not None:
            await self._fail(f"server could not score the episode: {reply.get('message')}")
        return EnvReward(self.options.error_reward, {"env_error": 1.0})

    async def close(self) -> None:
        """Closing the socket ends the server's session (it closes its env); always safe."""
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), timeout=2.0)
            except Exception:
                pass

    # ---- rollback: the state stays on the server, we hold its id --------------------------------
    def snapshot(self) -> Any:
        raise NotImplementedError("RemoteEnv snapshots over the network: use `await asnapshot()`")

    def restore(self, state: Any) -> None:
        raise NotImplementedError("RemoteEnv restores over the network: use `await arestore()`")

    async def asnapshot(self) -> int | None:
        """A server-side snapshot id; ``None`` (and ``fatal_error`` set) if the server failed."""
        if not self.supports_snapshot:
            raise NotImplementedError("the served environment cannot snapshot its state")
        reply = await self._request({"op": "snapshot"}, "snapshot")
        if reply is not None and isinstance(reply.get("id"), int) and reply["op"] == "snapshot":
            return reply["id"]
        if reply is not None:
            await self._fail(f"snapshot failed: {reply.get('message', reply)!r:.200}")
        return None

    async def arestore(self, state: int | None) -> None:
        if not self.supports_snapshot:
            raise NotImplementedError("the served environment cannot restore its state")
        if state is None or self.fatal_error is not None:
            return
        reply = await self._request({"op": "restore", "id": state}, "restored")
        if reply is not None and reply["op"] == "error":
            await self._fail(f"restore failed: {reply.get('message')}")

    # ---- transport ----------------------------------------------------------------------------
    async def _connect(self) -> bool:
        """A session opened (``self._ws``); on failure ``fatal_error`` says why."""
        host = urlsplit(self.options.url).hostname or ""
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else None
        try:
            self._ws = await connect(
                self.options.url,
                additional_headers=headers,
                open_timeout=self.options.connect_timeout_s,
                close_timeout=2.0,
                ping_interval=None,  # a trainer busy generating cannot answer pings in time
                max_size=self.options.max_message_bytes,
                proxy=None if is_loopback(host) else True,
            )
        except InvalidStatus as e:
            code = e.response.status_code
            hint = {401: " (check the token)", 403: " (check the token)"}.get(code, "")
            hint = " (server at its session limit, see --max-sessions)" if code == 503 else hint
            said = (e.response.body or b"").decode("utf-8", "replace").strip()[:300]
            hint = f": {said}" if code == 403 and said else hint  # serve-env's Origin/Host refusal
            await self._fail(f"{self.options.url} refused the session: HTTP {code}{hint}")
            return False
        except (OSError, asyncio.TimeoutError, WebSocketException) as e:
            await self._fail(f"cannot connect to {self.options.url}: {type(e).__name__}: {e}")
            return False
        # The answer stays here unless the server's environment declared it needs it at reset;
        # a server that says nothing (an older one) gets the whole task, as before.
        wanted = self._ws.response.headers.get(GROUND_TRUTH_HEADER) if self._ws.response else None
        self._ground_truth_sent = wanted in (None, "reset")
        return True

    def _wire_task(self, task: Task) -> dict[str, Any]:
        """``task`` as sent at reset: without its answer unless the server asked for it."""
        if self._ground_truth_sent:
            return task_to_dict(task)
        # the reference solution (SFT target) is an answer too
        meta = {k: v for k, v in task.meta.items() if k not in _ANSWER_META}
        out = task_to_dict(replace(task, ground_truth="", meta=meta))
        del out["ground_truth"]
        return out

    async def _request(self, msg: dict[str, Any], expect: str) -> dict[str, Any] | None:
        """The server's reply (op ``expect`` or ``error``), or ``None`` once the episode is lost."""
        if self.fatal_error is not None:
            return None
        op = msg["op"]
        async with self._lock:
            if self._ws is None:
                await self._fail(f"{op} before reset (no connection)")
                return None
            try:
                await asyncio.wait_for(
                    self._ws.send(json.dumps(msg, default=str)), self.options.timeout_s
                )
                raw = await asyncio.wait_for(self._ws.recv(), self.options.timeout_s)
            except asyncio.TimeoutError:
                await self._fail(f"no reply to {op} within {self.options.timeout_s:g}s")
                return None
            except (OSError, WebSocketException) as e:
                await self._fail(f"connection lost during {op}: {type(e).__name__}: {e}")
                return None
        try:
            reply = json.loads(raw)
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
            await self._fail(f"reply to {op} is not JSON: {e}")
            return None
        if not isinstance(reply, dict) or reply.get("op") not in (expect, "error"):
            await self._fail(f"unexpected reply to {op}: {str(reply)[:200]}")
            return None
        return reply

    async def _fail(self, message: str) -> None:
        if self.fatal_error is None:
            self.fatal_error = f"remote env {self.options.url}: {message}"
        await self.close()

    def _transport_result(self, call: ToolCall) -> ToolResult:
        return ToolResult(
            f"Error: the environment server is unavailable ({self.fatal_error})",
            is_error=True,
            error_type="transport",
            name=call.name,
            call_id=call.id,
        )


@register_env("remote")
def make_remote_env(task: Task, options: Mapping[str, Any]) -> RemoteEnv:
    return RemoteEnv(task, RemoteOptions.parse(options))

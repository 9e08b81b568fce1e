"""One ``serve-env`` connection's episode: its frames decoded, its ops run, its replies encoded.

Kept apart from the transport (``server.py``, ``server_http.py``) so the protocol's behaviour for
any frame, hostile or not, can be read (and tested) without a socket.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.registry import get_env_factory
from toolgrpo.envs.server_openings import openings_reply
from toolgrpo.envs.wire import (
    WireError,
    call_from_dict,
    result_to_dict,
    reward_to_dict,
    task_from_dict,
    transcript_from_dict,
)

log = logging.getLogger(__name__)


def error_frame(message: str, request: str | None = None) -> dict[str, Any]:
    """The protocol's error reply; the session lives on after it."""
    return {"op": "error", "message": message, "request": request}


def decode_frame(raw: str) -> dict[str, Any]:
    """A frame as a message; ``WireError`` for one that cannot be parsed. Nesting deeper than the
    interpreter's recursion limit (``[[[[…``) raises ``RecursionError`` inside ``json``: that is
    a bad frame like any other, not a reason to drop the connection."""
    try:
        msg = json.loads(raw)
    except json.JSONDecodeError as e:
        raise WireError(f"bad JSON: {e}") from None
    except RecursionError:
        raise WireError("bad JSON: nested too deeply") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise WireError("a message is a JSON object with a string field 'op'")
    return msg


def encode_reply(reply: Mapping[str, Any]) -> str:
    """A reply as text; one that cannot be encoded (an env echoing a frame nested too deeply to
    write back) becomes an error reply naming the request, so the client still gets its answer."""
    try:
        return json.dumps(reply, default=str)
    except (RecursionError, TypeError, ValueError) as e:
        op = reply.get("op")
        message = f"the reply to this request could not be encoded: {type(e).__name__}"
        return json.dumps(error_frame(message, op if isinstance(op, str) else None))


def needs_ground_truth_at_reset(factory: Any) -> bool:
    """Declared by an env class (or set on a factory function); the answer is withheld otherwise."""
    return bool(getattr(factory, "needs_ground_truth_at_reset", False))


class Session:
    """One connection's episode: the env it built and the snapshots it took."""

    def __init__(self, env_type: str, options: Mapping[str, Any]) -> None:
        self.env_type = env_type
        self.options = options
        self.env: Env | None = None
        self.task: Task | None = None  # what the env was built with (answer filled in at reward)
        self.snapshots: dict[int, Any] = {}
        self.openings_served = 0  # ``openings`` requests answered (a measuring session)
        self._ops = {
            "reset": self._reset,
            "openings": self._openings,
            "step": self._step,
            "next_user": self._next_user,
            "reward": self._reward,
            "snapshot": self._snapshot,
            "restore": self._restore,
        }

    async def handle(self, raw: str) -> dict[str, Any]:
        """The reply to one frame; never raises (env failures become error replies)."""
        try:
            msg = decode_frame(raw)
        except WireError as e:
            return error_frame(str(e))
        op = msg["op"]
        if op == "close":
            await self.close()
            return {"op": "closed"}
        handler = self._ops.get(op)
        if handler is None:
            return error_frame(f"unknown op {op!r}; known: close, {', '.join(self._ops)}", op)
        if op not in ("reset", "openings") and self.env is None:
            return error_frame("no episode yet: send reset first", op)
        try:
            return await handler(msg)
        except WireError as e:
            return error_frame(str(e), op)
        except Exception as e:  # an env bug must not take the server (or other sessions) down
            log.exception("%s env failed on %s", self.env_type, op)
            return error_frame(f"{op} failed: {type(e).__name__}: {e}", op)

    @property
    def started(self) -> bool:
        """An episode was reset, or openings were served: past the handshake's deadline."""
        return self.env is not None or self.openings_served > 0

    async def _openings(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Openings of many tasks, each from an environment of its own built, reset and closed
        here (``server_openings.py``); this session's episode, if any, is not touched."""
        factory = get_env_factory(self.env_type)
        reply = await openings_reply(lambda task: factory(task, self.options), msg)
        self.openings_served += 1
        return reply

    async def _reset(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.env is not None:
            return error_frame("one episode per connection: open a new connection", "reset")
        task = task_from_dict(msg.get("task"))
        env = get_env_factory(self.env_type)(task, self.options)
        try:
            start = await env.reset()
        except BaseException:
            await env.close()
            raise
        self.env, self.task = env, task
        return {
            "op": "start",
            "messages": start.messages,
            "tools": start.tools,
            "max_turns": env.max_turns,
            "single_turn": env.single_turn,
            "snapshot": bool(env.supports_snapshot),
        }

    async def _step(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.env is not None
        calls = msg.get("calls")
        if not isinstance(calls, list):
            raise WireError("step: field 'calls' must be a list")
        results = await self.env.step([call_from_dict(c) for c in calls])
        return {
            "op": "results",
            "results": [result_to_dict(r) for r in results],
            "fatal_error": self.env.fatal_error,
        }

    async def _next_user(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.env is not None
        messages = msg.get("messages")
        if not isinstance(messages, list):
            raise WireError("next_user: field 'messages' must be a list")
        return {"op": "user", "messages": await self.env.next_user_turn(messages)}

    async def _reward(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.env is not None and self.task is not None
        transcript = transcript_from_dict(msg.get("transcript"))
        if "ground_truth" in msg:
            # Withheld until now: environments read ``task.ground_truth`` when scoring (through
            # ``self.task`` or a closure over the task), so the task object they were built with
            # gets it. The server made that object from the wire; nobody else holds it.
            object.__setattr__(self.task, "ground_truth", str(msg["ground_truth"]))
        reward = await self.env.reward(transcript)
        return {"op": "reward", **reward_to_dict(reward)}

    async def _snapshot(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.env is not None
        if not self.env.supports_snapshot:
            return error_frame(
                f"environment {self.env_type!r} cannot snapshot its state", "snapshot"
            )
        sid = len(self.snapshots)
        self.snapshots[sid] = self.env.snapshot()
        return {"op": "snapshot", "id": sid}

    async def _restore(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.env is not None
        sid = msg.get("id", len(self.snapshots) - 1)
        if not isinstance(sid, int) or sid not in self.snapshots:
            return error_frame(f"no snapshot with id {sid!r}", "restore")
        self.env.restore(self.snapshots[sid])
        return {"op": "restored", "id": sid}

    async def close(self) -> None:
        env, self.env = self.env, None
        self.snapshots.clear()
        if env is not None:
            try:
                await env.close()
            except Exception:
                log.exception("%s env failed to close", self.env_type)

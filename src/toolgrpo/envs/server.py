"""Serve any registered environment over a WebSocket, one connection per episode.

Running an environment in its own process (or machine) keeps heavy or fragile tools away from the
trainer: if the server dies, only the episodes it was serving end, with an error reward.

Protocol (JSON text frames; every request gets exactly one reply, in order)::

    {"op": "reset", "task": {task_id, messages, data_source, task_type, tools, meta}}
      -> {"op": "start", "messages": [...], "tools": [...], "max_turns": N, "single_turn": bool,
          "snapshot": bool}
    {"op": "step", "calls": [{name, arguments, raw, parse_error, id}, ...]}
      -> {"op": "results", "results": [{text, is_error, error_type, name, call_id, metrics}, ...],
          "fatal_error": str | null}
    {"op": "next_user", "messages": [...]}          -> {"op": "user", "messages": [...] | null}
    {"op": "reward", "transcript": {messages, text, stop_reason, num_turns, step},
     "ground_truth": str}  -> {"op": "reward", "score": x, "parts": {...}}
    {"op": "snapshot"}                               -> {"op": "snapshot", "id": k}
    {"op": "restore", "id": k}  (id defaults to the latest snapshot) -> {"op": "restored", "id": k}
    {"op": "close"}                                  -> {"op": "closed"}, then the socket closes
    anything unusable -> {"op": "error", "message": "...", "request": op | null} (session lives on)

The first ``reset`` builds the session's environment with the server's fixed options (a client
cannot change them); a second ``reset`` on the same connection is refused. Snapshots stay on the
server, the client holds only their ids. ``GET /health`` is open; when the server has a token,
``GET /info`` (else 401) and the ``/ws`` handshake (else 403) need ``Authorization: Bearer <tok>``
(scheme name in any case). There is no ``/docs`` or ``/openapi.json``.

The answer stays with the trainer during the episode: the handshake reply's
``x-toolgrpo-ground-truth`` header says ``reward`` (the default: ``reset`` carries no ground truth,
``reward`` does, and the server puts it into the task the environment was built with just before
scoring) or ``reset`` (an environment type that sets ``needs_ground_truth_at_reset``, e.g. one that
runs the reference solution beside the model's calls, gets it with the task).

A session idle for ``idle_timeout_s`` is closed (code 1001); past ``max_sessions`` open sessions a
new handshake is refused with HTTP 503.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, WebSocket, WebSocketDisconnect
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocketState

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.registry import EnvConfigError, get_env_factory
from toolgrpo.envs.wire import (
    GROUND_TRUTH_HEADER,
    WireError,
    call_from_dict,
    is_loopback,
    result_to_dict,
    reward_to_dict,
    task_from_dict,
    transcript_from_dict,
)

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
TOKEN_ENV = "TOOLGRPO_ENV_TOKEN"


def _error(message: str, request: str | None = None) -> dict[str, Any]:
    return {"op": "error", "message": message, "request": request}


def _authorized(header: str | None, token: str | None) -> bool:
    """``Bearer <token>``; the scheme name is case-insensitive (RFC 7235), the token is not."""
    if token is None:
        return True
    scheme, _, given = (header or "").strip().partition(" ")
    ok = hmac.compare_digest(given.strip().encode(), token.encode())
    return scheme.lower() == "bearer" and ok


def needs_ground_truth_at_reset(factory: Any) -> bool:
    """Declared by an env class (or set on a factory function); the answer is withheld otherwise."""
    return bool(getattr(factory, "needs_ground_truth_at_reset", False))


class _Session:
    """One connection's episode: the env it built and the snapshots it took."""

    def __init__(self, env_type: str, options: Mapping[str, Any]) -> None:
        self.env_type = env_type
        self.options = options
        self.env: Env | None = None
        self.task: Task | None = None  # what the env was built with (answer filled in at reward)
        self.snapshots: dict[int, Any] = {}
        self._ops = {
            "reset": self._reset,
            "step": self._step,
            "next_user": self._next_user,
            "reward": self._reward,
            "snapshot": self._snapshot,
            "restore": self._restore,
        }

    async def handle(self, raw: str) -> dict[str, Any]:
        """The reply to one frame; never raises (env failures become error replies)."""
        try:
            msg = json.loads(raw)
        except json.JSONDecodeError as e:
            return _error(f"bad JSON: {e}")
        op = msg.get("op") if isinstance(msg, dict) else None
        if not isinstance(op, str):
            return _error("a message is a JSON object with a string field 'op'")
        if op == "close":
            await self.close()
            return {"op": "closed"}
        handler = self._ops.get(op)
        if handler is None:
            return _error(f"unknown op {op!r}; known: close, {', '.join(self._ops)}", op)
        if op != "reset" and self.env is None:
            return _error("no episode yet: send reset first", op)
        try:
            return await handler(msg)
        except WireError as e:
            return _error(str(e), op)
        except Exception as e:  # an env bug must not take the server (or other sessions) down
            log.exception("%s env failed on %s", self.env_type, op)
            return _error(f"{op} failed: {type(e).__name__}: {e}", op)

    async def _reset(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.env is not None:
            return _error("one episode per connection: open a new connection", "reset")
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
            return _error(f"environment {self.env_type!r} cannot snapshot its state", "snapshot")
        sid = len(self.snapshots)
        self.snapshots[sid] = self.env.snapshot()
        return {"op": "snapshot", "id": sid}

    async def _restore(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.env is not None
        sid = msg.get("id", len(self.snapshots) - 1)
        if not isinstance(sid, int) or sid not in self.snapshots:
            return _error(f"no snapshot with id {sid!r}", "restore")
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


def check_options(env_type: str, options: Mapping[str, Any]) -> None:
    """Raise ``EnvConfigError`` at startup for options the env type refuses. Probed by building one
    env on an empty task; an env that cannot be built without a real task is checked at reset."""
    factory = get_env_factory(env_type)
    probe = Task("options-check", ({"role": "user", "content": ""},), "")
    try:
        env = factory(probe, dict(options))
    except EnvConfigError:
        raise
    except Exception:  # needs a real task (e.g. BFCL): its options are checked per episode
        return
    close = getattr(env, "close", None)
    if close is not None:
        try:
            asyncio.run(close())
        except Exception:
            pass


def create_app(
    env_type: str,
    options: Mapping[str, Any],
    token: str | None = None,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
) -> FastAPI:
    """An app serving ``env_type``; raises ``EnvConfigError`` now if the type or an option is
    unknown, ``ValueError`` for limits out of range."""
    if not idle_timeout_s > 0:
        raise ValueError(f"--idle-timeout must be > 0 seconds, got {idle_timeout_s}")
    if max_sessions < 1:
        raise ValueError(f"--max-sessions must be >= 1, got {max_sessions}")
    factory = get_env_factory(env_type)
    options = dict(options)
    check_options(env_type, options)
    gt_when = b"reset" if needs_ground_truth_at_reset(factory) else b"reward"
    # No /docs, /redoc or /openapi.json: nothing to learn there for anyone without the token.
    app = FastAPI(
        title=f"toolgrpo env: {env_type}", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.sessions = 0
    app.state.idle_closed = 0
    # Known for env classes; for factory functions it is learnt from the first episode.
    app.state.supports_snapshot = getattr(factory, "supports_snapshot", None)

    def require_token(authorization: str | None = Header(default=None)) -> None:
        if not _authorized(authorization, token):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info", dependencies=[Depends(require_token)])
    async def info() -> dict[str, Any]:
        return {
            "env_type": env_type,
            "supports_snapshot": app.state.supports_snapshot,
            "protocol": PROTOCOL_VERSION,
            "sessions": app.state.sessions,
            "max_sessions": max_sessions,
            "idle_timeout_s": idle_timeout_s,
            "ground_truth_at": gt_when.decode(),
        }

    @app.websocket("/ws")
    async def episode(websocket: WebSocket) -> None:
        if not _authorized(websocket.headers.get("authorization"), token):
            # Closing before accept refuses the handshake (HTTP 403). A 401 denial response would
            # also work, but uvicorn then logs a spurious "returned without completing handshake".
            await websocket.close(code=1008, reason="missing or wrong bearer token")
            return
        if app.state.sessions >= max_sessions:
            msg = f"server at its session limit ({max_sessions}): retry later"
            try:
                await websocket.send_denial_response(PlainTextResponse(msg, status_code=503))
            except RuntimeError:  # an ASGI server without denial responses: a plain refusal
                await websocket.close(code=1013, reason=msg)
            return
        app.state.sessions += 1  # counted before accept: no await between check and count
        try:
            await websocket.accept(headers=[(GROUND_TRUTH_HEADER.encode(), gt_when)])
        except BaseException:
            app.state.sessions -= 1
            raise
        session = _Session(env_type, options)
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(websocket.receive(), idle_timeout_s)
                except asyncio.TimeoutError:  # a client that went quiet holds no env forever
                    app.state.idle_closed += 1
                    log.info("closing a session idle for %gs", idle_timeout_s)
                    await websocket.close(code=1001, reason=f"idle for {idle_timeout_s:g}s")
                    break
                if frame["type"] == "websocket.disconnect":
                    break
                text = frame.get("text")
                if text is None:
                    text = (frame.get("bytes") or b"").decode("utf-8", "replace")
                reply = await session.handle(text)
                if session.env is not None:
                    app.state.supports_snapshot = bool(session.env.supports_snapshot)
                await websocket.send_text(json.dumps(reply, default=str))
                if reply["op"] == "closed":
                    break
        except (WebSocketDisconnect, RuntimeError, OSError):  # client gone mid-reply
            pass
        finally:
            app.state.sessions -= 1
            await session.close()
            if websocket.application_state == WebSocketState.CONNECTED:
                try:
                    await websocket.close()
                except RuntimeError:
                    pass

    return app


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` strings as env options; values read as YAML scalars (``3`` is an int)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "a").replace("-", "a").isalnum():
            raise ValueError(f"--option expects KEY=VALUE with a plain key, got {pair!r}")
        if key in out:
            raise ValueError(f"--option {key} given twice")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def read_token(token_file: str | None = None) -> str | None:
    """The server's token from ``--token-file`` or ``$TOOLGRPO_ENV_TOKEN`` (never the command
    line, where every user of the machine can read it in the process list)."""
    if token_file:
        p = Path(token_file)
        try:
            text = p.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read --token-file {p}: {e}") from e
        if not text:
            raise ValueError(f"--token-file {p} is empty")
        return text
    return os.environ.get(TOKEN_ENV) or None


def serve(
    env_type: str,
    options: Mapping[str, Any],
    host: str = "127.0.0.1",
    port: int = 8900,
    token: str | None = None,
    access_log: bool = False,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
) -> None:
    """Run the server until interrupted; refuses a non-loopback address without a token."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be in 1..65535, got {port}")
    if not is_loopback(host) and not token:
        raise ValueError(
            f"refusing to serve on {host!r} without a token: anyone who can reach it could run "
            f"the environment's tools. Set {TOKEN_ENV} or pass --token-file, or bind to 127.0.0.1"
        )
    import uvicorn

    app = create_app(env_type, options, token, idle_timeout_s, max_sessions)
    # No keepalive pings: a trainer busy generating for a minute must not lose its sessions;
    # a dead peer is noticed by the closed socket, the idle timeout or the client's timeout.
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="info",
        access_log=access_log,  # one line per episode is noise at training scale
        ws_max_size=MAX_MESSAGE_BYTES,
        ws_ping_interval=None,
        ws_ping_timeout=None,
    )
